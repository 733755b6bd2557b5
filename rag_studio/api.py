from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response

from accounts.permissions import WorkspaceScopedMixin
from assets.views import bundle_download
from cluster import queues
from cluster.api import QueuePlaceSerializer
from rag_studio import embedding_choice, selectors, services
from rag_studio.bundles import export_config_bundle
from rag_studio.evals import evaluation, jobs, tuning
from rag_studio.models import (
    Chunk,
    Document,
    DocumentEvent,
    EvalItem,
    EvalResult,
    EvalRun,
    EvalSet,
    Finding,
    KnowledgeBase,
    OcrPage,
    RagConfig,
    RagConfigVersion,
    RagTemplate,
    RetrievalTuning,
    TuningObjective,
    TuningTrial,
)
from rag_studio.pipeline import line
from rag_studio.pipeline.ocr import validate_ocr
from rag_studio.search.retrieval import retrieve


class KnowledgeBaseSerializer(serializers.ModelSerializer):
    embedding_model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    embedding_deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    document_count = serializers.IntegerField(read_only=True)
    indexed_count = serializers.IntegerField(read_only=True)
    needs_reindex = serializers.SerializerMethodField()
    index_search = serializers.SerializerMethodField(
        help_text="How dense search runs on the live index: \"exact\", or the approximate index in use (\"ivf\" "
                  "once a segment of the embedded store holds FACTORY_RAG_INDEX_ANN_THRESHOLD chunks)")
    embedding_model_reason = serializers.SerializerMethodField(
        help_text="Why the knowledge base has this embedding model: the user's choice, or picked from the language "
                  "of its first documents before they were embedded")
    embedding_model_mismatch = serializers.SerializerMethodField(
        help_text="Set when the model does not read the knowledge base's text (an English-only model on Chinese "
                  "text), with what to do; null otherwise")
    ocr = serializers.SerializerMethodField(
        help_text="OCR of scanned pages and images: mode (auto, always, never) and languages (auto: Chinese and "
                  "English; en: English only)")

    class Meta:
        model = KnowledgeBase
        fields = ["id", "name", "description", "embedding_model", "embedding_deployment", "embedding_dimensions",
                  "embedding_model_source", "embedding_model_reason", "embedding_model_mismatch",
                  "chunking", "screening", "ocr", "retrieval", "keyword_terms", "language", "index_key",
                  "building_key",
                  "needs_reindex", "index_backend", "index_search", "document_count", "indexed_count", "created_at",
                  "updated_at"]
        read_only_fields = ["language", "embedding_model_source", "index_backend"]

    def get_needs_reindex(self, obj) -> bool:
        return selectors.needs_reindex(obj)

    def get_index_search(self, obj) -> str:
        return selectors.index_search(obj)

    def _fit(self, kb) -> embedding_choice.EmbeddingFit:
        return _once(self.context, f"embedding_fit:{kb.pk}", lambda: embedding_choice.embedding_fit(kb))

    def get_embedding_model_reason(self, obj) -> str:
        return self._fit(obj).reason

    def get_embedding_model_mismatch(self, obj) -> str | None:
        return self._fit(obj).mismatch or None

    def get_ocr(self, obj) -> dict:
        return validate_ocr(obj.ocr)


class KnowledgeBaseWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=96, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    embedding_model = serializers.CharField(required=False, allow_blank=True)
    embedding_deployment = serializers.CharField(required=False, allow_blank=True)
    chunking = serializers.JSONField(required=False)
    screening = serializers.JSONField(required=False)
    ocr = serializers.JSONField(
        required=False, help_text='OCR of scans and images, e.g. {"mode": "auto", "languages": "auto"}: mode auto '
                                  '(pages without a usable text layer), always or never; languages auto (Chinese and '
                                  'English) or en. Applies to documents ingested after the change')
    retrieval = serializers.JSONField(required=False)
    keyword_terms = serializers.JSONField(
        required=False, help_text="Domain terms keyword search keeps whole, e.g. [\"数据湖仓\", \"kube-proxy\"]; a "
                                  "change needs a re-index")
    reindex = serializers.BooleanField(required=False, default=False,
                                       help_text="Start the re-index at once if the change needs one")


class DocumentSerializer(serializers.ModelSerializer):
    queue = serializers.SerializerMethodField(help_text="Where a queued document stands in the ingestion line; "
                                                        "null once it is being ingested or done.")

    class Meta:
        model = Document
        fields = ["id", "knowledge_base", "filename", "kind", "size_bytes", "sha256", "status", "stage", "progress",
                  "queue", "error_code", "error", "page_count", "ocr_page_count", "ocr_pages_done", "char_count",
                  "chunk_count", "attempts", "created_at", "indexed_at"]

    @extend_schema_field(QueuePlaceSerializer(allow_null=True))
    def get_queue(self, document) -> dict | None:
        place = _once(self.context, "ingestion_line", line.Snapshot).place(
            document.pk, document.knowledge_base.workspace_id)
        return place.as_dict() if place else None


def _once(context: dict, key: str, make):
    """One read of a line for a whole response: a list's items share their serializer's context."""
    if key not in context:
        context[key] = make()
    return context[key]


class InteractivePlace(serializers.Serializer):
    """`queue`: where queued work stands in the interactive line; null once it runs or is done."""

    queue = serializers.SerializerMethodField()
    job_task = ""

    @extend_schema_field(QueuePlaceSerializer(allow_null=True))
    def get_queue(self, row) -> dict | None:
        place = jobs.place(_once(self.context, "interactive_line", queues.interactive_line), type(row), self.job_task,
                           row)
        return place.as_dict() if place else None


class FindingSerializer(serializers.ModelSerializer):
    class Meta:
        model = Finding
        fields = ["category", "kind", "action", "page", "start", "end", "preview"]


class OcrPageSerializer(serializers.ModelSerializer):
    low_confidence = serializers.SerializerMethodField(
        help_text="Read with less confidence than FACTORY_RAG_OCR_LOW_CONFIDENCE: check this page's text")

    class Meta:
        model = OcrPage
        fields = ["page", "confidence", "low_confidence", "rotation", "skew", "lines", "seconds"]

    def get_low_confidence(self, page) -> bool:
        return page.confidence is not None and page.confidence < settings.RAG_OCR_LOW_CONFIDENCE


class DocumentEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = DocumentEvent
        fields = ["stage", "message", "worker", "created_at"]


class DocumentDetailSerializer(DocumentSerializer):
    findings = FindingSerializer(many=True, read_only=True)
    ocr_pages = OcrPageSerializer(many=True, read_only=True)
    events = DocumentEventSerializer(many=True, read_only=True)

    class Meta(DocumentSerializer.Meta):
        fields = DocumentSerializer.Meta.fields + ["findings", "ocr_pages", "events"]


class UploadOutcomeSerializer(serializers.Serializer):
    filename = serializers.CharField()
    status = serializers.CharField()
    document = DocumentSerializer()
    duplicate_of = serializers.IntegerField(source="duplicate_of.pk", allow_null=True, default=None)


class ChunkSerializer(serializers.ModelSerializer):
    class Meta:
        model = Chunk
        fields = ["id", "ordinal", "text", "page", "start", "end", "heading", "parent", "searchable"]


class HitTestSerializer(serializers.Serializer):
    query = serializers.CharField(allow_blank=True, trim_whitespace=False)
    retrieval = serializers.JSONField(required=False, help_text="Overrides of the knowledge base's defaults")
    compare = serializers.JSONField(required=False, help_text="A second set of overrides (a candidate, e.g. a tuning "
                                                              "trial's settings) to run on the same query")


def upload_files(request) -> list:
    uploads = request.FILES.getlist("files") or request.FILES.getlist("file")
    if not uploads:
        raise serializers.ValidationError({"files": ["Send one or more files as multipart field 'files'."]})
    return uploads


class KnowledgeBaseViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet, mixins.ListModelMixin,
                           mixins.RetrieveModelMixin):
    """Knowledge bases of the workspace. Documents are uploaded to one and ingested in the background."""

    serializer_class = KnowledgeBaseSerializer
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self):
        return selectors.knowledge_bases(workspace=self.workspace)

    def get_object(self) -> KnowledgeBase:
        return selectors.scoped(self.get_queryset(), self.kwargs["pk"], "Knowledge base")

    def _write_data(self) -> dict:
        data = KnowledgeBaseWriteSerializer(data=self.request.data)
        data.is_valid(raise_exception=True)
        return dict(data.validated_data)

    @extend_schema(request=KnowledgeBaseWriteSerializer, responses={201: KnowledgeBaseSerializer})
    def create(self, request):
        data = self._write_data()
        data.pop("reindex")
        if not data.get("name"):
            raise serializers.ValidationError({"name": ["This field is required."]})
        kb = services.create_knowledge_base(actor=self.actor, workspace=self.workspace, **data)
        return Response(KnowledgeBaseSerializer(self.get_queryset().get(pk=kb.pk)).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=KnowledgeBaseWriteSerializer, responses=KnowledgeBaseSerializer)
    def partial_update(self, request, pk=None):
        services.update_knowledge_base(actor=self.actor, kb=self.get_object(), **self._write_data())
        return Response(KnowledgeBaseSerializer(self.get_object()).data)

    def destroy(self, request, pk=None):
        services.delete_knowledge_base(actor=self.actor, kb=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=KnowledgeBaseSerializer)
    @action(detail=True, methods=["post"])
    def reindex(self, request, pk=None):
        services.start_reindex(actor=self.actor, kb=self.get_object())
        return Response(KnowledgeBaseSerializer(self.get_object()).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(methods=["GET"], responses=DocumentSerializer(many=True))
    @extend_schema(methods=["POST"], request={"multipart/form-data": {"type": "object", "properties": {
        "files": {"type": "array", "items": {"type": "string", "format": "binary"}}}}},
        responses={201: UploadOutcomeSerializer(many=True)})
    @action(detail=True, methods=["get", "post"])
    def documents(self, request, pk=None):
        """GET lists the documents with status and progress; POST uploads files (multipart field `files`)."""
        kb = self.get_object()
        if request.method == "GET":
            return Response(DocumentSerializer(kb.documents.select_related("knowledge_base"), many=True).data)
        outcomes = services.upload_documents(actor=self.actor, kb=kb, uploads=upload_files(request))
        return Response(UploadOutcomeSerializer(outcomes, many=True).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=HitTestSerializer, responses=dict)
    @action(detail=True, methods=["post"], url_path="hit-test")
    def hit_test(self, request, pk=None):
        """Retrieve for a query and return every hit with its dense, keyword, fused and rerank scores; with
        `compare`, the same for a second set of settings, side by side."""
        data = HitTestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        kb, query = self.get_object(), data.validated_data["query"]
        body = _retrieval_body(retrieve(kb, query, data.validated_data.get("retrieval")))
        if "compare" in data.validated_data:
            body["compare"] = _retrieval_body(retrieve(kb, query, data.validated_data["compare"]))
        return Response(body)


def _retrieval_body(result) -> dict:
    """Each hit also says whether its page was read by OCR with low confidence (`low_confidence_ocr`)."""
    unsure = selectors.low_confidence_ocr(pages={(hit.document_id, hit.page) for hit in result.hits})
    return {"query": result.query, "settings": result.settings, "timings_ms": result.timings_ms,
            "rerank_unparseable": result.rerank_unparseable,
            "hits": [{**hit.as_dict(), "low_confidence_ocr": (hit.document_id, hit.page) in unsure}
                     for hit in result.hits]}


class DocumentViewSet(WorkspaceScopedMixin, mixins.RetrieveModelMixin, mixins.ListModelMixin,
                      viewsets.GenericViewSet):
    serializer_class = DocumentDetailSerializer

    def get_queryset(self):
        return selectors.documents(workspace=self.workspace).prefetch_related("findings", "ocr_pages", "events")

    def get_object(self) -> Document:
        return selectors.scoped(self.get_queryset(), self.kwargs["pk"], "Document")

    def destroy(self, request, pk=None):
        services.delete_document(actor=self.actor, document=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=DocumentDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop a queued or processing document (its OCR, say) at its next step; a retry goes on from there."""
        return Response(DocumentDetailSerializer(services.cancel_document(actor=self.actor,
                                                                          document=self.get_object())).data)

    @extend_schema(request=None, responses=DocumentDetailSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        return Response(DocumentDetailSerializer(services.retry_document(actor=self.actor,
                                                                         document=self.get_object())).data)

    @extend_schema(responses=ChunkSerializer(many=True))
    @action(detail=True, methods=["get"])
    def chunks(self, request, pk=None):
        return Response(ChunkSerializer(self.get_object().chunks.all()[:1000], many=True).data)


class RagConfigVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = RagConfigVersion
        fields = ["number", "settings", "checksum", "created_at"]


class RagConfigSerializer(serializers.ModelSerializer):
    knowledge_base = serializers.PrimaryKeyRelatedField(queryset=KnowledgeBase.objects.none())
    template = serializers.ChoiceField(choices=RagTemplate.choices, default=RagTemplate.CITATIONS)
    retrieval = serializers.JSONField(required=False, default=dict)
    generation = serializers.JSONField(required=False, default=dict)

    class Meta:
        model = RagConfig
        fields = ["id", "name", "knowledge_base", "template", "model", "prompt", "retrieval", "generation",
                  "version", "created_at", "updated_at"]
        read_only_fields = ["version", "created_at", "updated_at"]

    def __init__(self, *args, workspace=None, **kwargs):
        super().__init__(*args, **kwargs)
        if workspace is not None:
            self.fields["knowledge_base"].queryset = KnowledgeBase.objects.filter(workspace=workspace)


class RunSerializer(serializers.Serializer):
    query = serializers.CharField(allow_blank=True)
    history = serializers.ListField(child=serializers.DictField(), required=False, default=list)
    version = serializers.IntegerField(required=False, help_text="Defaults to the latest version")


class ExportSerializer(serializers.Serializer):
    version = serializers.IntegerField(required=False, min_value=1)
    include_indexes = serializers.BooleanField(required=False, default=False)


class RagConfigViewSet(WorkspaceScopedMixin, viewsets.ModelViewSet):
    """RAG configs. Every save that changes settings is a new version; `run` answers with citations."""

    serializer_class = RagConfigSerializer

    def get_queryset(self):
        return selectors.rag_configs(workspace=self.workspace)

    def get_object(self) -> RagConfig:
        return selectors.scoped(self.get_queryset(), self.kwargs["pk"], "RAG config")

    def get_serializer(self, *args, **kwargs):
        return RagConfigSerializer(*args, workspace=self.workspace, **kwargs)

    def _save(self, config: RagConfig | None, partial: bool = False) -> RagConfig:
        data = self.get_serializer(config, data=self.request.data, partial=partial)
        data.is_valid(raise_exception=True)
        # A field left out keeps the config's value, or on creation the service's default (a blank prompt).
        values = {field: data.validated_data[field] if field in data.validated_data else getattr(config, field)
                  for field in ("name", "knowledge_base", "template", "model", "prompt", "retrieval", "generation")
                  if field in data.validated_data or config is not None}
        return services.save_rag_config(actor=self.actor, workspace=self.workspace, config=config, **values)

    def create(self, request):
        config = self._save(None)
        return Response(self.get_serializer(config).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None, partial=False):
        return Response(self.get_serializer(self._save(self.get_object(), partial=partial)).data)

    def partial_update(self, request, pk=None):
        return self.update(request, pk, partial=True)

    def destroy(self, request, pk=None):
        services.delete_rag_config(actor=self.actor, config=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=RagConfigVersionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def versions(self, request, pk=None):
        return Response(RagConfigVersionSerializer(self.get_object().versions.all(), many=True).data)

    @extend_schema(request=RunSerializer, responses=dict)
    @action(detail=True, methods=["post"])
    def run(self, request, pk=None):
        """Answer one question with this config (the latest version unless `version` is given)."""
        data = RunSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = selectors.config_version(self.get_object(), data.validated_data.get("version"))
        result = services.pipeline_for(version).run(data.validated_data["query"], data.validated_data["history"])
        return Response({"answer": result.answer, "citations": result.citations(), "queries": result.queries,
                         "usage": result.usage, "timings_ms": result.timings_ms, "version": version.number})

    @extend_schema(parameters=[
        OpenApiParameter("version", int, required=False, description="Defaults to the latest version"),
        OpenApiParameter("include_indexes", bool, required=False,
                         description="Also bundle the chunks and vectors, so the import is searchable at once")],
        responses={(200, "application/zip"): OpenApiTypes.BINARY})
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        """Download a signed bundle of the config with its knowledge base and documents (developer role)."""
        params = ExportSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        exported = export_config_bundle(actor=self.actor, config=self.get_object(),
                                        version_number=params.validated_data.get("version"),
                                        include_indexes=params.validated_data["include_indexes"])
        return bundle_download(exported.path, exported.filename)


class EvalItemSerializer(serializers.ModelSerializer):
    class Meta:
        model = EvalItem
        fields = ["id", "question", "expected_answer", "expected_sources", "evidence", "source_chunk", "hidden_chunks"]


class EvalSetSerializer(InteractivePlace, serializers.ModelSerializer):
    item_count = serializers.IntegerField(read_only=True)
    job_task = jobs.GENERATE_TASK

    class Meta:
        model = EvalSet
        fields = ["id", "name", "knowledge_base", "source", "status", "queue", "generator", "requested_items",
                  "error", "item_count", "created_at"]


class EvalSetCreateSerializer(serializers.Serializer):
    knowledge_base = serializers.IntegerField()
    name = serializers.CharField(required=False, allow_blank=True, default="")
    file = serializers.FileField(required=False, help_text="CSV or JSONL: question, expected_answer, "
                                                           "expected_sources")
    generator = serializers.CharField(required=False, help_text="Generate from the corpus with this deployment")
    count = serializers.IntegerField(required=False, default=20)


class EvalSetViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Eval sets: upload a file, or name a `generator` deployment to write questions from sampled chunks."""

    serializer_class = EvalSetSerializer
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self):
        return selectors.eval_sets(workspace=self.workspace)

    def get_object(self) -> EvalSet:
        return selectors.scoped(self.get_queryset(), self.kwargs["pk"], "Eval set")

    def destroy(self, request, pk=None):
        evaluation.delete_eval_set(actor=self.actor, eval_set=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=EvalSetCreateSerializer, responses={201: EvalSetSerializer})
    def create(self, request):
        data = EvalSetCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        kb = selectors.scoped(selectors.knowledge_bases(workspace=self.workspace), spec["knowledge_base"],
                              "Knowledge base")
        if spec.get("file"):
            eval_set = evaluation.upload_eval_set(actor=self.actor, kb=kb, name=spec["name"],
                                                  filename=spec["file"].name, content=spec["file"].read())
        elif spec.get("generator"):
            eval_set = evaluation.start_generation(actor=self.actor, kb=kb, name=spec["name"],
                                                   generator=spec["generator"], count=spec["count"])
        else:
            raise serializers.ValidationError({"file": ["Upload a file, or name a generator deployment."]})
        return Response(EvalSetSerializer(self.get_queryset().get(pk=eval_set.pk)).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=EvalSetSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop generating questions; those written so far are kept."""
        evaluation.cancel_generation(actor=self.actor, eval_set=self.get_object())
        return Response(EvalSetSerializer(self.get_queryset().get(pk=pk)).data)

    @extend_schema(responses=EvalItemSerializer(many=True))
    @action(detail=True, methods=["get"])
    def items(self, request, pk=None):
        return Response(EvalItemSerializer(self.get_object().items.all(), many=True).data)


class EvalResultSerializer(serializers.ModelSerializer):
    question = serializers.CharField(source="item.question")
    expected_answer = serializers.CharField(source="item.expected_answer")
    expected_sources = serializers.JSONField(source="item.expected_sources")

    class Meta:
        model = EvalResult
        fields = ["id", "question", "expected_answer", "expected_sources", "answer", "retrieved", "metrics",
                  "judge_output", "error", "latency_ms"]


class EvalRunSerializer(InteractivePlace, serializers.ModelSerializer):
    config = serializers.CharField(source="config_version.config.name", read_only=True)
    config_version = serializers.IntegerField(source="config_version.number", read_only=True)
    job_task = jobs.RUN_TASK

    class Meta:
        model = EvalRun
        fields = ["id", "eval_set", "config", "config_version", "judge", "top_k", "status", "queue", "progress",
                  "metrics", "judge_unparseable", "error", "created_at", "finished_at"]


class EvalRunCreateSerializer(serializers.Serializer):
    eval_set = serializers.IntegerField()
    config = serializers.IntegerField()
    version = serializers.IntegerField(required=False)
    judge = serializers.CharField(required=False, allow_blank=True, default="")
    top_k = serializers.IntegerField(required=False, default=5)


class EvalRunViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     viewsets.GenericViewSet):
    serializer_class = EvalRunSerializer

    def get_queryset(self):
        return selectors.eval_runs(workspace=self.workspace)

    def get_object(self) -> EvalRun:
        return selectors.scoped(self.get_queryset(), self.kwargs["pk"], "Eval run")

    @extend_schema(request=EvalRunCreateSerializer, responses={201: EvalRunSerializer})
    def create(self, request):
        data = EvalRunCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        eval_set = selectors.scoped(selectors.eval_sets(workspace=self.workspace), spec["eval_set"], "Eval set")
        config = selectors.scoped(selectors.rag_configs(workspace=self.workspace), spec["config"], "RAG config")
        run = evaluation.start_run(actor=self.actor, eval_set=eval_set,
                                   version=selectors.config_version(config, spec.get("version")),
                                   judge=spec["judge"], top_k=spec["top_k"])
        return Response(EvalRunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=EvalRunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the run; the questions scored so far are kept."""
        return Response(EvalRunSerializer(evaluation.cancel_run(actor=self.actor, run=self.get_object())).data)

    @extend_schema(responses=EvalResultSerializer(many=True))
    @action(detail=True, methods=["get"])
    def results(self, request, pk=None):
        return Response(EvalResultSerializer(self.get_object().results.select_related("item"), many=True).data)


class TuningTrialSerializer(serializers.ModelSerializer):
    class Meta:
        model = TuningTrial
        fields = ["number", "params", "settings", "tuning_metrics", "holdout_metrics"]


class TuningSerializer(InteractivePlace, serializers.ModelSerializer):
    trials = TuningTrialSerializer(many=True, read_only=True)
    job_task = jobs.TUNE_TASK

    class Meta:
        model = RetrievalTuning
        fields = ["id", "knowledge_base", "eval_set", "config", "trials_requested", "top_k", "rerank_model",
                  "rewrite_model", "seed", "objective", "status", "queue", "progress", "report", "error",
                  "applied_to", "applied", "created_at", "finished_at", "trials"]


class TuningCreateSerializer(serializers.Serializer):
    knowledge_base = serializers.IntegerField()
    eval_set = serializers.IntegerField()
    config = serializers.IntegerField(required=False, allow_null=True, default=None,
                                      help_text="Tune this RAG config (its settings are the baseline and receive the "
                                                "winner); without one, the knowledge base's defaults")
    trials = serializers.IntegerField(required=False, default=30)
    top_k = serializers.IntegerField(required=False, default=5)
    rerank_model = serializers.CharField(required=False, allow_blank=True, default="",
                                         help_text="Also try rerank with this cross-encoder or chat deployment")
    rewrite_model = serializers.CharField(required=False, allow_blank=True, default="",
                                          help_text="Also try query rewriting with this chat deployment")
    seed = serializers.IntegerField(required=False, default=0, min_value=0)
    objective = serializers.ChoiceField(choices=TuningObjective.choices, required=False,
                                        default=TuningObjective.HIT_AT_K,
                                        help_text="What ranks the trials: hit@k first with MRR to break ties (the "
                                                  "default), MRR first, or their mean")


class TuningApplySerializer(serializers.Serializer):
    trial = serializers.IntegerField(required=False, help_text="Apply this trial instead of the suggested one")


class TuningViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                    viewsets.GenericViewSet):
    """Retrieval tuning: search a knowledge base's retrieval settings on one of its eval sets, then apply the
    winner as a new version of the config (or of the knowledge base's defaults)."""

    serializer_class = TuningSerializer

    def get_queryset(self):
        return selectors.tunings(workspace=self.workspace).prefetch_related("trials")

    def get_object(self) -> RetrievalTuning:
        return selectors.scoped(self.get_queryset(), self.kwargs["pk"], "Tuning job")

    @extend_schema(request=TuningCreateSerializer, responses={201: TuningSerializer})
    def create(self, request):
        data = TuningCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        kb = selectors.scoped(selectors.knowledge_bases(workspace=self.workspace), spec["knowledge_base"],
                              "Knowledge base")
        eval_set = selectors.scoped(selectors.eval_sets(workspace=self.workspace), spec["eval_set"], "Eval set")
        config = None if spec["config"] is None else selectors.scoped(
            selectors.rag_configs(workspace=self.workspace), spec["config"], "RAG config")
        job = tuning.start_tuning(actor=self.actor, kb=kb, eval_set=eval_set, config=config, trials=spec["trials"],
                                  top_k=spec["top_k"], rerank_model=spec["rerank_model"],
                                  rewrite_model=spec["rewrite_model"], seed=spec["seed"],
                                  objective=spec["objective"])
        return Response(TuningSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=TuningSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return Response(TuningSerializer(tuning.cancel_tuning(actor=self.actor, tuning=self.get_object())).data)

    @extend_schema(request=None, responses=TuningSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return Response(TuningSerializer(tuning.resume_tuning(actor=self.actor, tuning=self.get_object())).data)

    @extend_schema(request=TuningApplySerializer, responses=TuningSerializer)
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        data = TuningApplySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = self.get_object()
        tuning.apply_tuning(actor=self.actor, tuning=job, trial_number=data.validated_data.get("trial"))
        return Response(TuningSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(request=None, responses=TuningSerializer)
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        """Put back the settings the last apply replaced, as a new version."""
        job = self.get_object()
        tuning.rollback_tuning(actor=self.actor, tuning=job)
        return Response(TuningSerializer(self.get_queryset().get(pk=job.pk)).data)
