from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace
from serving.models import Deployment, Model


class EmbeddingModelSource(models.TextChoices):
    CHOSEN = "chosen", _("Chosen by the user")
    PENDING = "pending", _("To be chosen from the first documents' language")
    DETECTED = "detected", _("Chosen from the first documents' language")


class IndexBackend(models.TextChoices):
    EMBEDDED = "embedded", _("Embedded (files on this node)")
    PGVECTOR = "pgvector", _("pgvector (Postgres, shared by every node)")


class KnowledgeBase(models.Model):
    """Documents indexed with one embedding model and one chunking mode. `index_key` names the on-disk index that
    retrieval reads; a re-index builds `building_key` beside it and swaps when every document is done."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="knowledge_bases")
    name = models.CharField(max_length=96)
    description = models.TextField(blank=True)
    embedding_model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="+")
    embedding_deployment = models.ForeignKey(Deployment, on_delete=models.SET_NULL, null=True, blank=True,
                                             related_name="+")
    embedding_dimensions = models.PositiveIntegerField()
    # Existing rows keep the model they have: only a base created without one waits for its documents' language.
    embedding_model_source = models.CharField(max_length=16, choices=EmbeddingModelSource.choices,
                                              default=EmbeddingModelSource.CHOSEN)
    embedding_model_evidence = models.JSONField(
        default=dict, blank=True, help_text="What the automatic choice read: the language of the first documents, "
                                            "their share of Chinese text, and the model it replaced")
    chunking = models.JSONField(default=dict)
    screening = models.JSONField(default=dict)
    ocr = models.JSONField(default=dict, blank=True,
                           help_text="OCR of scans and images: {mode, languages} (pipeline/ocr validate_ocr); {} means "
                                     "the defaults")
    retrieval = models.JSONField(default=dict)
    index_key = models.CharField(max_length=64)
    indexed_with = models.JSONField(default=dict, help_text="The embedding model and chunking of the live index")
    building_key = models.CharField(max_length=64, blank=True)
    building_with = models.JSONField(default=dict)
    index_backend = models.CharField(max_length=16, choices=IndexBackend.choices, default=IndexBackend.EMBEDDED)
    index_home = models.JSONField(
        default=dict, blank=True, help_text="Embedded indexes: the node and data dir that hold them ({'node', "
                                            "'data_dir'}); a worker with another data dir must not write them")
    language = models.CharField(max_length=8, blank=True,
                                help_text="What most of its text is written in ('zh' or 'en'), read when documents "
                                          "finish indexing; '' before any is indexed")
    keyword_terms = models.JSONField(
        default=list, blank=True, help_text="The user's domain terms, kept whole by keyword search "
                                            "(search.keywords.tokenizer_for)")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_kb_name_per_workspace")]

    def __str__(self) -> str:
        return self.name


class DocumentStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    PROCESSING = "processing", _("Processing")
    INDEXED = "indexed", _("Indexed")
    FAILED = "failed", _("Failed")


class Stage(models.TextChoices):
    PARSE = "parse", _("Parse")
    OCR = "ocr", _("OCR")
    CLEAN = "clean", _("Clean")
    SCREEN = "screen", _("Screen")
    CHUNK = "chunk", _("Chunk")
    EMBED = "embed", _("Embed")
    INDEX = "index", _("Index")
    DONE = "done", _("Done")


class Document(models.Model):
    """An uploaded file and where its ingestion stands. The stage is the next one to run, so a worker that picks
    the document up again continues there."""

    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="documents")
    filename = models.CharField(max_length=255)
    kind = models.CharField(max_length=16)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=DocumentStatus.choices, default=DocumentStatus.QUEUED)
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.PARSE)
    progress = models.PositiveSmallIntegerField(default=0)
    error_code = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    page_count = models.PositiveIntegerField(default=0)
    ocr_page_count = models.PositiveIntegerField(default=0, help_text="Pages read by OCR (scanned, or images)")
    ocr_pages_done = models.PositiveIntegerField(default=0, help_text="Of those, the pages read so far")
    char_count = models.PositiveIntegerField(default=0)
    chunk_count = models.PositiveIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=0)
    lease_owner = models.CharField(max_length=128, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="When its task message was last sent")
    chunk_set = models.CharField(max_length=32, blank=True,
                                 help_text="Names the current chunk rows; saved vectors are only valid for it")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    indexed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["knowledge_base", "sha256"], name="unique_document_content")]

    def __str__(self) -> str:
        return self.filename


class DocumentEvent(models.Model):
    """Stage transitions, resumptions and failures: the document's ingestion log."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="events")
    stage = models.CharField(max_length=16, choices=Stage.choices)
    message = models.CharField(max_length=500)
    worker = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]


class OcrPage(models.Model):
    """A page whose text OCR read, and how sure the recogniser was of it (over its characters; null for a page
    where no text was found)."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="ocr_pages")
    page = models.PositiveIntegerField()
    confidence = models.FloatField(null=True, blank=True)
    rotation = models.PositiveSmallIntegerField(default=0, help_text="Degrees the page was turned to be read")
    skew = models.FloatField(default=0, help_text="Degrees its lines sloped")
    lines = models.PositiveIntegerField(default=0)
    seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["document_id", "page"]
        constraints = [models.UniqueConstraint(fields=["document", "page"], name="unique_ocr_page")]


class Finding(models.Model):
    """One screening finding. `preview` is masked for PII and secrets, so it is safe to show."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="findings")
    category = models.CharField(max_length=16)
    kind = models.CharField(max_length=48)
    action = models.CharField(max_length=16)
    page = models.PositiveIntegerField(null=True, blank=True)
    start = models.PositiveIntegerField()
    end = models.PositiveIntegerField()
    preview = models.CharField(max_length=200)

    class Meta:
        ordering = ["id"]


class Chunk(models.Model):
    """A piece of a document. Parent chunks (parent-child mode) are returned by retrieval but never indexed."""

    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="chunks")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    ordinal = models.PositiveIntegerField()
    text = models.TextField()
    page = models.PositiveIntegerField(null=True, blank=True)
    start = models.PositiveIntegerField()
    end = models.PositiveIntegerField()
    heading = models.CharField(max_length=500, blank=True)
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")
    searchable = models.BooleanField(default=True)

    class Meta:
        ordering = ["document_id", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["document", "ordinal"], name="unique_chunk_ordinal")]

    @property
    def location(self) -> str:
        where = f"p. {self.page}" if self.page else f"chars {self.start}–{self.end}"
        return f"{self.document.filename}, {where}"


class RagTemplate(models.TextChoices):
    BASIC = "basic", _("Basic QA")
    CITATIONS = "citations", _("QA with inline citations")
    CONVERSATIONAL = "conversational", _("Conversational (rewrites the question from history)")
    MULTI_QUERY = "multi_query", _("Multi-query (several rewrites, fused)")


class RagConfig(models.Model):
    """A runnable RAG assistant. Every save writes a new RagConfigVersion; runs and apps use a version."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="rag_configs")
    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="rag_configs")
    name = models.CharField(max_length=96)
    template = models.CharField(max_length=32, choices=RagTemplate.choices, default=RagTemplate.CITATIONS)
    model = models.CharField(max_length=96, help_text="A deployment or model name the gateway serves")
    prompt = models.TextField(blank=True)
    retrieval = models.JSONField(default=dict)
    generation = models.JSONField(default=dict)
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_rag_config_name")]

    def __str__(self) -> str:
        return self.name


class RagConfigVersion(models.Model):
    config = models.ForeignKey(RagConfig, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    settings = models.JSONField()
    checksum = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["config", "number"], name="unique_rag_config_version")]

    def __str__(self) -> str:
        return f"{self.config.name} v{self.number}"


class EvalSetSource(models.TextChoices):
    UPLOADED = "uploaded", _("Uploaded")
    GENERATED = "generated", _("Generated from the corpus")
    FEEDBACK = "feedback", _("Corrected answers from app feedback")


class JobStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class LeasedJob(models.Model):
    """What the lease-held runner (evals/jobs.py) reads and writes on each of its jobs."""

    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    lease_owner = models.CharField(max_length=128, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True


class EvalSet(LeasedJob):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="eval_sets")
    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="eval_sets")
    name = models.CharField(max_length=96)
    source = models.CharField(max_length=16, choices=EvalSetSource.choices)
    # An uploaded set is done when saved; a generated one is queued (services.generate_eval_set).
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.DONE)
    generator = models.CharField(max_length=96, blank=True)
    requested_items = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name


class EvalItem(models.Model):
    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="items")
    question = models.TextField()
    expected_answer = models.TextField(blank=True)
    expected_sources = models.JSONField(default=list, help_text="Document filenames or chunk ids")
    evidence = models.TextField(blank=True, help_text="Words of the answering passage: a hit holding them is relevant")
    source_chunk = models.ForeignKey(Chunk, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    hidden_chunks = models.JSONField(
        default=list, blank=True,
        help_text="Chunk ids left out of this question's results: they hold the question's own sentence (a "
                  "held-out question, rag_studio/evals/adaptive.py)")

    class Meta:
        ordering = ["id"]


class EvalRun(LeasedJob):
    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="runs")
    config_version = models.ForeignKey(RagConfigVersion, on_delete=models.CASCADE, related_name="eval_runs")
    judge = models.CharField(max_length=96, blank=True)
    top_k = models.PositiveSmallIntegerField(default=5)
    progress = models.PositiveSmallIntegerField(default=0)
    metrics = models.JSONField(default=dict)
    judge_unparseable = models.PositiveIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class EvalResult(models.Model):
    run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="results")
    item = models.ForeignKey(EvalItem, on_delete=models.CASCADE, related_name="+")
    answer = models.TextField(blank=True)
    retrieved = models.JSONField(default=list, help_text="[{chunk_id, document, score}] in rank order")
    metrics = models.JSONField(default=dict)
    judge_output = models.TextField(blank=True)
    error = models.TextField(blank=True)
    latency_ms = models.FloatField(null=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["run", "item"], name="unique_eval_result")]


class TuningObjective(models.TextChoices):
    HIT_AT_K = "hit@k", _("hit@k first, MRR to break ties")
    MRR = "mrr", _("MRR first, hit@k to break ties")
    MEAN = "mean", _("(hit@k + MRR) / 2")


class RetrievalTuning(LeasedJob):
    """A search over a knowledge base's retrieval settings on one of its eval sets (rag_studio/evals/tuning.py).
    Its trials are kept as they finish, so a cancelled or killed job resumes where it stopped."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="retrieval_tunings")
    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="tunings")
    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="tunings")
    config = models.ForeignKey(RagConfig, on_delete=models.SET_NULL, null=True, blank=True, related_name="tunings",
                               help_text="Whose settings are the baseline and receive the winner; without one, the "
                                         "knowledge base's defaults")
    trials_requested = models.PositiveSmallIntegerField(default=30)
    top_k = models.PositiveSmallIntegerField(default=5)
    rerank_model = models.CharField(max_length=96, blank=True,
                                    help_text="Also try rerank with this cross-encoder or chat deployment")
    rewrite_model = models.CharField(max_length=96, blank=True,
                                     help_text="Also try query rewriting (multi-query) with this chat deployment")
    seed = models.PositiveIntegerField(default=0)
    objective = models.CharField(max_length=8, choices=TuningObjective.choices, default=TuningObjective.HIT_AT_K,
                                 help_text="What ranks the trials")
    automatic = models.BooleanField(default=False,
                                    help_text="Started by the platform on questions drawn from the knowledge base's "
                                              "own text (evals/adaptive.py), when it finished indexing")
    progress = models.PositiveSmallIntegerField(default=0)
    report = models.JSONField(default=dict)
    applied_to = models.CharField(max_length=96, blank=True, help_text="Where the winner was saved, and its version")
    applied = models.JSONField(default=dict, blank=True,
                               help_text="The last apply: the trial, where it went (config and version, or the "
                                         "knowledge base), the settings it replaced, and whether it was rolled back")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class TuningTrial(models.Model):
    """One setting tried: number 0 is the baseline (the settings in use when the job started)."""

    tuning = models.ForeignKey(RetrievalTuning, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveSmallIntegerField()
    params = models.JSONField(default=dict, help_text="What the sampler chose")
    settings = models.JSONField(default=dict, help_text="The retrieval settings (and template) those params make")
    tuning_metrics = models.JSONField(default=dict)
    holdout_metrics = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["number"]
        constraints = [models.UniqueConstraint(fields=["tuning", "number"], name="unique_tuning_trial")]
