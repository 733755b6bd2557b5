import re

from django.conf import settings
from django.db.models import BooleanField, Count, ExpressionWrapper, Q

from accounts.errors import NotFound
from accounts.models import Workspace
from rag_studio.models import (
    Document,
    DocumentStatus,
    EvalRun,
    EvalSet,
    KnowledgeBase,
    OcrPage,
    RagConfig,
    RagConfigVersion,
    RetrievalTuning,
)
from rag_studio.pipeline import line
from rag_studio.search.keywords import TOKENS_VERSION, domain_terms_version
from rag_studio.search.retrieval_config import validate_retrieval
from rag_studio.search.stores import store_for
from serving.models import RoleHint, ServingState
from serving.selectors import deployments_visible_to


def knowledge_bases(*, workspace: Workspace):
    return (KnowledgeBase.objects.filter(workspace=workspace).select_related("embedding_model",
                                                                             "embedding_deployment")
            .annotate(document_count=Count("documents", distinct=True),
                      indexed_count=Count("documents", filter=Q(documents__status="indexed"), distinct=True)))


def documents(*, workspace: Workspace):
    return Document.objects.filter(knowledge_base__workspace=workspace).select_related("knowledge_base")


def index_settings(kb: KnowledgeBase) -> dict:
    """What the index content depends on: a change to any means every chunk must be rebuilt."""
    settings = {"embedding_model": kb.embedding_model.name, "chunking": kb.chunking, "keyword_tokens": TOKENS_VERSION}
    if terms := domain_terms_version(kb.keyword_terms):  # absent without terms: older indexes still match
        settings["keyword_terms"] = terms
    return settings


def needs_reindex(kb: KnowledgeBase) -> bool:
    """Whether the index (the one being built, else the live one) no longer matches the settings."""
    target = kb.building_with if kb.building_key else kb.indexed_with
    return target != index_settings(kb)


def index_search(kb: KnowledgeBase) -> str:
    """How the live index's dense side is searched: "exact", or the approximate index in use ("ivf" in the
    embedded store once a segment holds RAG_INDEX_ANN_THRESHOLD chunks)."""
    return store_for(kb).search_method()


def ready_embedding_deployments(workspace: Workspace):
    return deployments_visible_to(workspace=workspace).filter(model__role_hint=RoleHint.EMBEDDING,
                                                              state=ServingState.READY)


def document_progress(*, kb: KnowledgeBase) -> list[dict]:
    """What the GUI polls: each document's status, stage and progress, and a queued one's place in line."""
    documents = list(kb.documents.annotate(finding_count=Count("findings")).values(
        "id", "filename", "kind", "size_bytes", "status", "stage", "progress", "error", "error_code",
        "chunk_count", "page_count", "ocr_page_count", "ocr_pages_done", "finding_count"))
    snapshot = line.Snapshot() if any(d["status"] == DocumentStatus.QUEUED for d in documents) else None
    for document in documents:
        place = snapshot and snapshot.place(document["id"], kb.workspace_id)
        document["queue"] = place.as_dict() if place else None
    return documents


def ocr_pages(*, document: Document):
    """The pages of the document OCR read, each with `low_confidence`: read with less confidence than
    RAG_OCR_LOW_CONFIDENCE."""
    return document.ocr_pages.annotate(low_confidence=ExpressionWrapper(
        Q(confidence__lt=settings.RAG_OCR_LOW_CONFIDENCE), output_field=BooleanField()))


def low_confidence_ocr(*, pages) -> set[tuple[int, int]]:
    """Of `pages`, (document id, page) pairs, those OCR read with less confidence than RAG_OCR_LOW_CONFIDENCE:
    hit testing flags hits from them."""
    documents = {document for document, page in pages if page}
    unsure = OcrPage.objects.filter(document_id__in=documents, confidence__lt=settings.RAG_OCR_LOW_CONFIDENCE)
    return set(unsure.values_list("document_id", "page")) & set(pages)


# Chinese characters, against Latin letters, in a knowledge base's text.
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")
MOSTLY_CHINESE_SHARE = 0.5


def chinese_share(texts) -> float | None:
    """How much of the text is Chinese, 0–1, weighing one character as four Latin letters (about what each
    carries); None when there is no text in either."""
    cjk = latin = 0
    for text in texts:
        cjk += len(_CJK.findall(text))
        latin += len(_LATIN.findall(text)) / 4
    if not cjk and not latin:
        return None
    return cjk / (cjk + latin)


def text_language(texts) -> str:
    """'zh' when most of the text is Chinese, 'en' when there is other text, '' when there is none."""
    share = chinese_share(texts)
    if share is None:
        return ""
    return "zh" if share >= MOSTLY_CHINESE_SHARE else "en"


def knowledge_base_language(*, kb: KnowledgeBase, sample: int = 200) -> str:
    """What most of the knowledge base's text (its first `sample` searchable chunks) is written in. Ingestion
    stores it on the knowledge base (`KnowledgeBase.language`) as documents finish, so that answers need not
    read it."""
    return text_language(kb.chunks.filter(searchable=True).order_by("pk").values_list("text", flat=True)[:sample])


def rag_configs(*, workspace: Workspace):
    return RagConfig.objects.filter(workspace=workspace).select_related("knowledge_base")


def config_version(config: RagConfig, number: int | None = None) -> RagConfigVersion:
    """The config's version `number`, or its latest."""
    version = config.versions.filter(number=number).first() if number else config.versions.first()
    if version is None:
        raise NotFound(f"Version {number} of '{config.name}' not found.")
    return version


def eval_sets(*, workspace: Workspace):
    return EvalSet.objects.filter(workspace=workspace).select_related("knowledge_base").annotate(
        item_count=Count("items"))


def eval_runs(*, workspace: Workspace):
    return EvalRun.objects.filter(eval_set__workspace=workspace).select_related("eval_set",
                                                                                "config_version__config")


def tunings(*, workspace: Workspace):
    return RetrievalTuning.objects.filter(workspace=workspace).select_related("knowledge_base", "eval_set", "config")


def tuned_settings_in_use(kb: KnowledgeBase) -> dict | None:
    """The tuning job and trial whose applied settings the knowledge base searches with by default, while they
    still are (neither rolled back nor changed since), with the held-back measurements behind them."""
    job = kb.tunings.filter(config=None, applied__target="knowledge_base").order_by("-pk").first()
    if job is None or job.applied.get("rolled_back"):
        return None
    trial = job.trials.filter(number=job.applied["trial"]).first()
    baseline = job.trials.filter(number=0).first()
    if trial is None or baseline is None or trial.settings["retrieval"] != validate_retrieval(kb.retrieval):
        return None
    return {"job": job, "trial": trial.number, "questions": trial.holdout_metrics["n"],
            "hit": trial.holdout_metrics["hit@k"], "hit_before": baseline.holdout_metrics["hit@k"]}


def scoped(queryset, pk, what: str):
    """One object of a workspace-filtered queryset; anything else, another workspace's included, is a 404."""
    found = queryset.filter(pk=pk).first() if str(pk).isdigit() else None
    if found is None:
        raise NotFound(f"{what} {pk} not found in this workspace.")
    return found
