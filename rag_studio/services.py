"""Knowledge bases and their documents: create and configure, upload, delete, re-index. The ingestion stages
themselves live in `pipeline.ingestion` (uploaded files on disk in `pipeline.storage`), retrieval in
`search.retrieval`, and the reads in `selectors`."""

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext

from accounts.errors import Conflict, NotFound, ServiceUnavailable, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from assets.models import AssetKind, AssetVersion
from assets.services import forget_asset, payload_checksum, register_asset
from rag_studio import files, log_messages as log, selectors
from rag_studio.embedding import check_local_model
from rag_studio.models import (
    Document,
    DocumentEvent,
    DocumentStatus,
    EmbeddingModelSource,
    KnowledgeBase,
    RagConfig,
    RagConfigVersion,
    RagTemplate,
    Stage,
)
from rag_studio.pipeline import ingestion, storage
from rag_studio.pipeline.chunking import DEFAULT_CHUNKING, validate_chunking
from rag_studio.pipeline.ocr import DEFAULT_OCR, validate_ocr
from rag_studio.pipeline.parsing import ParseError, file_kind
from rag_studio.pipeline.screening import DEFAULT_POLICY, validate_policy
from rag_studio.rag import RagPipeline
from rag_studio.search import stores
from rag_studio.search.index_store import StoreUnavailable
from rag_studio.search.keywords import validate_domain_terms
from rag_studio.search.retrieval_config import validate_retrieval
from serving.models import Deployment, Model, RoleHint
from serving.selectors import chat_model_problem, deployments_visible_to, models_visible_to

DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"


def _fields_error(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, fields={field: [message]})


def _embedding_model(workspace: Workspace, name: str) -> Model:
    model = models_visible_to(workspace=workspace).filter(name=name).first()
    if model is None:
        raise _fields_error("embedding_model", f"No model named '{name}' is registered.")
    if model.role_hint != RoleHint.EMBEDDING:
        raise _fields_error("embedding_model", f"Model '{name}' is not an embedding model.")
    return model


def _embedding_deployment(workspace: Workspace, model: Model, name: str) -> Deployment:
    deployment = deployments_visible_to(workspace=workspace).filter(name=name).first()
    if deployment is None:
        raise _fields_error("embedding_deployment", f"No deployment named '{name}'.")
    if deployment.model_id != model.pk:
        raise _fields_error("embedding_deployment",
                            f"Deployment '{name}' serves '{deployment.model.name}', not '{model.name}'.")
    return deployment


def _validated(validate, field: str, value: dict):
    try:
        return validate(value)
    except ValueError as exc:
        raise _fields_error(field, str(exc))


def _index_key(model: Model, generation: int) -> str:
    # A token of its own: a knowledge base that reuses a deleted one's id (SQLite reuses the last row's) must not
    # find the old index's files, nor be served from a process's cache of them (the embedded store keys it by
    # directory).
    return f"{model.name[:40]}.{secrets.token_hex(4)}.v{generation}"


def _next_index_key(kb: KnowledgeBase) -> str:
    generation = int(kb.index_key.rsplit(".v", 1)[1]) + 1
    return _index_key(kb.embedding_model, generation)


@transaction.atomic
def create_knowledge_base(*, actor: Actor, workspace: Workspace, name: str, description: str = "",
                          embedding_model: str = "", embedding_deployment: str = "", chunking: dict | None = None,
                          screening: dict | None = None, ocr: dict | None = None, retrieval: dict | None = None,
                          keyword_terms: list[str] | None = None) -> KnowledgeBase:
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    name = name.strip()
    if not name:
        raise _fields_error("name", "A knowledge base needs a name.")
    try:
        stores.check_available(settings.RAG_INDEX_BACKEND)
    except StoreUnavailable as exc:
        raise ServiceUnavailable(str(exc), retry_after=60)
    if KnowledgeBase.objects.filter(workspace=workspace, name=name).exists():
        raise Conflict(gettext("A knowledge base named '%(name)s' already exists in this workspace.") % {"name": name})
    model = _embedding_model(workspace, embedding_model or DEFAULT_EMBEDDING_MODEL)
    deployment = _embedding_deployment(workspace, model, embedding_deployment) if embedding_deployment else None
    # Without a model of the user's, the default holds until the first documents' language picks one
    # (embedding_choice, just before they are embedded).
    source = EmbeddingModelSource.CHOSEN if embedding_model or deployment else EmbeddingModelSource.PENDING
    kb = KnowledgeBase.objects.create(
        workspace=workspace, name=name, description=description, embedding_model=model,
        embedding_deployment=deployment, embedding_dimensions=_dimensions(model), embedding_model_source=source,
        chunking=_validated(validate_chunking, "chunking", chunking or dict(DEFAULT_CHUNKING)),
        screening=_validated(validate_policy, "screening", screening or dict(DEFAULT_POLICY)),
        ocr=_validated(validate_ocr, "ocr", ocr or dict(DEFAULT_OCR)),
        retrieval=_validated(validate_retrieval, "retrieval", retrieval or {}),
        keyword_terms=_validated(validate_domain_terms, "keyword_terms", keyword_terms or []),
        index_key=_index_key(model, 1),
        index_backend=settings.RAG_INDEX_BACKEND,
        index_home=files.index_home(),
    )
    kb.indexed_with = selectors.index_settings(kb)
    kb.save(update_fields=["indexed_with"])
    # Files and indexes a deleted knowledge base with this id left behind (its deletion stopped halfway) go now.
    shutil.rmtree(files.kb_dir(kb.pk), ignore_errors=True)
    stores.drop_knowledge_base(kb.pk, kb.index_backend)
    register_kb_asset(kb, actor=actor)
    record_audit(actor=actor, workspace=workspace, action="rag.kb.create", target=kb, detail={"name": name})
    return kb


def register_kb_asset(kb: KnowledgeBase, *, actor: Actor | None = None) -> AssetVersion:
    """Record the knowledge base's settings and document set in the asset registry; a new version only when
    they changed. Called on saves, exports and publishing rather than per document, so uploads stay cheap."""
    documents = sorted(kb.documents.values_list("sha256", flat=True))
    payload = {"description": kb.description, "embedding_model": kb.embedding_model.name, "chunking": kb.chunking,
               "screening": kb.screening, "retrieval": kb.retrieval, "documents": documents}
    if kb.keyword_terms:  # absent without terms, so bases without them keep their asset version
        payload["keyword_terms"] = kb.keyword_terms
    if validate_ocr(kb.ocr) != DEFAULT_OCR:  # likewise
        payload["ocr"] = kb.ocr
    return register_asset(workspace=kb.workspace, kind=AssetKind.KNOWLEDGE_BASE, ref_id=kb.pk, name=kb.name,
                          payload=payload, actor=actor,
                          summary={"embedding_model": kb.embedding_model.name, "documents": len(documents)})


def _dimensions(model: Model) -> int:
    return model.embedding_dimensions or check_local_model(model.path)


def update_knowledge_base(*, actor: Actor, kb: KnowledgeBase, reindex: bool = False, **changes) -> bool:
    """Save settings. Returns whether the index no longer matches them (the embedding model or the chunking
    changed); with `reindex` the re-index starts at once, otherwise the GUI offers it."""
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    with transaction.atomic():
        if "name" in changes:
            name = changes["name"].strip()
            if not name:
                raise _fields_error("name", "A knowledge base needs a name.")
            if KnowledgeBase.objects.filter(workspace=kb.workspace, name=name).exclude(pk=kb.pk).exists():
                raise Conflict(gettext("A knowledge base named '%(name)s' already exists in this workspace.")
                               % {"name": name})
            kb.name = name
        if "description" in changes:
            kb.description = changes["description"]
        if changes.get("embedding_model"):
            model = _embedding_model(kb.workspace, changes["embedding_model"])
            # Naming the provisional default before the automatic choice is made is a choice too.
            if model.pk != kb.embedding_model_id or kb.embedding_model_source == EmbeddingModelSource.PENDING:
                kb.embedding_model_source = EmbeddingModelSource.CHOSEN
            if model.pk != kb.embedding_model_id:
                kb.embedding_model = model
                kb.embedding_dimensions = _dimensions(model)
        if "embedding_deployment" in changes:
            name = changes["embedding_deployment"]
            kb.embedding_deployment = _embedding_deployment(kb.workspace, kb.embedding_model, name) if name else None
        for field, validate in (("chunking", validate_chunking), ("screening", validate_policy), ("ocr", validate_ocr),
                                ("retrieval", validate_retrieval), ("keyword_terms", validate_domain_terms)):
            if changes.get(field) is not None:
                setattr(kb, field, _validated(validate, field, changes[field]))
        kb.save()
        register_kb_asset(kb, actor=actor)
        stale = selectors.needs_reindex(kb)
        record_audit(actor=actor, workspace=kb.workspace, action="rag.kb.update", target=kb,
                     detail={"fields": sorted(changes), "reindex": bool(reindex and stale)})
    if reindex and stale:
        start_reindex(actor=actor, kb=kb)
    return stale


def start_reindex(*, actor: Actor, kb: KnowledgeBase) -> str:
    """Rebuild every document's chunks and vectors into a new index beside the live one; retrieval keeps using
    the live index until the last document is done, then switches (see `ingestion.finish_documents`)."""
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    with transaction.atomic():
        kb = KnowledgeBase.objects.select_for_update().get(pk=kb.pk)
        previous_build = kb.building_key
        kb.building_key = _next_index_key(kb) if not previous_build else _bump(previous_build)
        kb.building_with = selectors.index_settings(kb)
        kb.save(update_fields=["building_key", "building_with", "updated_at"])
        # Documents not yet past screening reach the chunk stage anyway, and index into the new key then.
        documents = list(kb.documents.filter(stage__in=[Stage.CHUNK, Stage.EMBED, Stage.INDEX, Stage.DONE]))
        kb.documents.filter(pk__in=[d.pk for d in documents]).update(
            status=DocumentStatus.QUEUED, stage=Stage.CHUNK, progress=0, lease_owner="", lease_until=None,
            attempts=0, error="", error_code="")
        DocumentEvent.objects.bulk_create(
            [DocumentEvent(document=d, stage=Stage.CHUNK, message=f"Re-index into {kb.building_key}")
             for d in documents])
        record_audit(actor=actor, workspace=kb.workspace, action="rag.kb.reindex", target=kb,
                     detail={"index": kb.building_key, "documents": len(documents)})
        transaction.on_commit(lambda: ingestion.dispatch_ingest([d.pk for d in documents]))
    if previous_build:
        stores.store_for(kb, previous_build).drop()
    if not documents:
        ingestion.switch_to_built_index(kb.pk)
    return kb.building_key


def _bump(key: str) -> str:
    base, generation = key.rsplit(".v", 1)
    return f"{base}.v{int(generation) + 1}"


def delete_knowledge_base(*, actor: Actor, kb: KnowledgeBase) -> None:
    require_role(actor=actor, workspace=kb.workspace, role=Role.ADMIN)
    record_audit(actor=actor, workspace=kb.workspace, action="rag.kb.delete", target=kb, detail={"name": kb.name})
    kb_id = kb.pk
    with transaction.atomic():
        for config_id in kb.rag_configs.values_list("pk", flat=True):
            forget_asset(workspace=kb.workspace, kind=AssetKind.RAG_CONFIG, ref_id=config_id)
        forget_asset(workspace=kb.workspace, kind=AssetKind.KNOWLEDGE_BASE, ref_id=kb_id)
        kb.delete()
    shutil.rmtree(files.kb_dir(kb_id), ignore_errors=True)
    shutil.rmtree(files.uploads_dir(kb_id), ignore_errors=True)  # when shared storage holds them
    stores.drop_knowledge_base(kb_id, kb.index_backend)


@dataclass
class UploadOutcome:
    filename: str
    document: Document | None
    duplicate_of: Document | None = None

    @property
    def status(self) -> str:
        return "duplicate" if self.duplicate_of else self.document.status


def upload_documents(*, actor: Actor, kb: KnowledgeBase, uploads) -> list[UploadOutcome]:
    """Store each file (hashed while it streams to disk) and queue its ingestion. A file that cannot be ingested
    becomes a failed document with its reason; a file already in the knowledge base is reported as a duplicate.
    Either way the rest of the batch goes on."""
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    if not uploads:
        raise _fields_error("files", "Choose at least one file to upload.")
    outcomes = []
    for upload in uploads:
        try:
            outcomes.append(_store_upload(kb, upload))
        except OSError as exc:
            if exc.errno not in storage.DISK_FULL:
                raise
            stored = (gettext(" (%(count)s file(s) before it were stored)") % {"count": len(outcomes)}
                      if outcomes else "")
            raise storage.StorageFull(gettext("The data directory is full: '%(name)s' and the files after it were "
                                              "not stored%(stored)s. Free space on the server, then upload them "
                                              "again.")
                                      % {"name": Path(upload.name or 'unnamed').name, "stored": stored}, retry_after=60)
    record_audit(actor=actor, workspace=kb.workspace, action="rag.document.upload", target=kb,
                 detail={"files": [o.filename for o in outcomes], "statuses": [o.status for o in outcomes]})
    return outcomes


def _store_upload(kb: KnowledgeBase, upload) -> UploadOutcome:
    filename = Path(upload.name or "unnamed").name[:255]
    staged = storage.stage_upload(kb.pk, upload, max_bytes=settings.RAG_UPLOAD_MAX_BYTES)
    sha256, size = staged.sha256, staged.size
    existing = kb.documents.filter(sha256=sha256).first()
    if existing is not None:
        staged.discard()
        return UploadOutcome(filename=filename, document=existing, duplicate_of=existing)
    failure = _upload_failure(filename, size, staged.too_large)
    if failure is None:
        staged.keep()
    else:
        staged.discard()
    try:
        with transaction.atomic():
            document = Document.objects.create(
                knowledge_base=kb, filename=filename, kind=_kind_or_blank(filename), size_bytes=size, sha256=sha256,
                status=DocumentStatus.FAILED if failure else DocumentStatus.QUEUED,
                error_code=failure[0] if failure else "", error=failure[1] if failure else "")
            DocumentEvent.objects.create(document=document, stage=Stage.PARSE,
                                         message=log.REJECTED(reason=failure[1]) if failure else log.UPLOADED())
            if failure is None:
                transaction.on_commit(lambda: ingestion.dispatch_ingest([document.pk]))
    except IntegrityError:
        # The same file uploaded twice at once: the other upload stored it first (the file is the same bytes).
        existing = kb.documents.get(sha256=sha256)
        return UploadOutcome(filename=filename, document=existing, duplicate_of=existing)
    return UploadOutcome(filename=filename, document=document)


def _kind_or_blank(filename: str) -> str:
    try:
        return file_kind(filename)
    except ParseError:
        return ""


def _upload_failure(filename: str, size: int, too_large: bool) -> tuple[str, str] | None:
    if too_large:
        limit = settings.RAG_UPLOAD_MAX_BYTES / (1024 * 1024)
        return "too_large", f"The file is {size / (1024 * 1024):.1f} MiB; the limit is {limit:.0f} MiB."
    try:
        file_kind(filename)
    except ParseError as exc:
        return exc.code, exc.reason
    if size == 0:
        return "empty_file", "The file is empty (0 bytes)."
    return None


def retry_document(*, actor: Actor, document: Document) -> Document:
    """Queue a failed document again from the stage where it stopped, or send a queued one's task again (its
    message may have been lost)."""
    kb = document.knowledge_base
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    if document.status not in (DocumentStatus.FAILED, DocumentStatus.QUEUED):
        raise Conflict(gettext("'%(document)s' is %(status)s; only failed or queued documents can be retried.")
                       % {"document": document.filename, "status": gettext(document.status)})
    if not storage.is_stored(kb.pk, document.sha256):
        raise Conflict(gettext("'%(document)s' was never stored (%(error)s); upload a fixed file instead.")
                       % {"document": document.filename, "error": document.error})
    with transaction.atomic():
        Document.objects.filter(pk=document.pk).update(status=DocumentStatus.QUEUED, error="", error_code="",
                                                       lease_owner="", lease_until=None, attempts=0,
                                                       updated_at=timezone.now())
        DocumentEvent.objects.create(document=document, stage=document.stage, message=log.RETRY_REQUESTED())
        record_audit(actor=actor, workspace=kb.workspace, action="rag.document.retry", target=document)
        transaction.on_commit(lambda: ingestion.dispatch_ingest([document.pk]))
    document.refresh_from_db()
    return document


# Stored in English, as workers store reasons; the pages show it in the reader's language.
CANCELLED_REASON = "Cancelled; retry to go on from where it stopped."


def cancel_document(*, actor: Actor, document: Document) -> Document:
    """Stop a queued or processing document's ingestion: it fails as cancelled, and the worker that has it stops at
    its next step (an OCR page, an embedding call), since each renews its lease only while the document is still
    processing. What it saved (OCR pages read, vectors) stays, so a retry goes on from there."""
    kb = document.knowledge_base
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    with transaction.atomic():
        cancelled = Document.objects.filter(
            pk=document.pk, status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING]).update(
            status=DocumentStatus.FAILED, error_code="cancelled", error=CANCELLED_REASON, lease_owner="",
            lease_until=None, updated_at=timezone.now())
        if not cancelled:
            raise Conflict(gettext("'%(document)s' is %(status)s; only queued or processing documents can be "
                                   "cancelled.") % {"document": document.filename, "status": gettext(document.status)})
        DocumentEvent.objects.create(document=document, stage=document.stage,
                                     message=log.CANCELLED(user=actor.user.get_username() if actor.user else "-"))
        record_audit(actor=actor, workspace=kb.workspace, action="rag.document.cancel", target=document)
    document.refresh_from_db()
    return document


def delete_document(*, actor: Actor, document: Document) -> None:
    """Remove the document, its chunks from both indexes (live and any being built), and its files."""
    kb = document.knowledge_base
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    for key in filter(None, [kb.index_key, kb.building_key]):
        stores.store_for(kb, key).apply(removals=[str(document.pk)])
    record_audit(actor=actor, workspace=kb.workspace, action="rag.document.delete", target=document,
                 detail={"filename": document.filename})
    document_id, sha256 = document.pk, document.sha256
    document.delete()
    shutil.rmtree(files.work_dir(document_id), ignore_errors=True)
    storage.remove_stored(kb.pk, sha256)


def _chat_deployment(workspace: Workspace, name: str, field: str) -> None:
    """`name` answers chats for this workspace: a chat deployment or a model group (serving decides which)."""
    if problem := chat_model_problem(workspace=workspace, name=name):
        raise _fields_error(field, problem)


def _config_settings(config: RagConfig) -> dict:
    return {"knowledge_base_id": config.knowledge_base_id, "template": config.template, "model": config.model,
            "prompt": config.prompt, "retrieval": config.retrieval, "generation": config.generation}


def _generation(value: dict | None) -> dict:
    value = {"temperature": 0.2, "max_tokens": 256, **(value or {})}
    try:
        temperature, max_tokens = float(value["temperature"]), int(value["max_tokens"])
    except (TypeError, ValueError):
        raise _fields_error("generation", "temperature must be a number and max_tokens an integer.")
    if not 0 <= temperature <= 2 or not 1 <= max_tokens <= 4096:
        raise _fields_error("generation", "temperature must be 0–2 and max_tokens 1–4096.")
    return {"temperature": temperature, "max_tokens": max_tokens}


def save_rag_config(*, actor: Actor, workspace: Workspace, config: RagConfig | None = None, name: str,
                    knowledge_base: KnowledgeBase, template: str, model: str, prompt: str = "",
                    retrieval: dict | None = None, generation: dict | None = None) -> RagConfig:
    """Create or update a config. A save that changes its settings writes the next version; runs and published
    apps keep using the version they were given."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    name = name.strip()
    if not name:
        raise _fields_error("name", "A RAG config needs a name.")
    if knowledge_base.workspace_id != workspace.pk:
        raise NotFound("Knowledge base not found in this workspace.")
    if template not in RagTemplate.values:
        raise _fields_error("template", f"template must be one of {', '.join(RagTemplate.values)}.")
    _chat_deployment(workspace, model, "model")
    # Only the settings a config overrides are stored; the knowledge base's defaults fill in the rest.
    overrides = retrieval or {}
    _validated(validate_retrieval, "retrieval", {**knowledge_base.retrieval, **overrides})
    with transaction.atomic():
        clash = RagConfig.objects.filter(workspace=workspace, name=name)
        if config is not None:
            clash = clash.exclude(pk=config.pk)
        if clash.exists():
            raise Conflict(gettext("A RAG config named '%(name)s' already exists in this workspace.") % {"name": name})
        config = config or RagConfig(workspace=workspace, version=0)
        config.name, config.knowledge_base, config.template, config.model = name, knowledge_base, template, model
        config.prompt, config.retrieval, config.generation = prompt, overrides, _generation(generation)
        latest = config.versions.first() if config.pk else None
        settings_now = _config_settings(config)
        if latest is None or latest.settings != settings_now:
            config.version += 1
            config.save()
            RagConfigVersion.objects.create(config=config, number=config.version, settings=settings_now,
                                            checksum=payload_checksum(settings_now))
        else:
            config.save()
        register_config_asset(config, actor=actor)
        record_audit(actor=actor, workspace=workspace, action="rag.config.save", target=config,
                     detail={"version": config.version})
    return config


def register_config_asset(config: RagConfig, *, actor: Actor | None = None) -> AssetVersion:
    """Record the config's latest version in the asset registry. The payload is the version's settings, so the
    asset's checksum is the version's."""
    version = config.versions.first()
    return register_asset(workspace=config.workspace, kind=AssetKind.RAG_CONFIG, ref_id=config.pk, name=config.name,
                          payload=version.settings, actor=actor,
                          summary={"config_version": version.number, "knowledge_base": config.knowledge_base.name,
                                   "model": config.model, "template": config.template})


def delete_rag_config(*, actor: Actor, config: RagConfig) -> None:
    require_role(actor=actor, workspace=config.workspace, role=Role.DEVELOPER)
    record_audit(actor=actor, workspace=config.workspace, action="rag.config.delete", target=config,
                 detail={"name": config.name})
    with transaction.atomic():
        forget_asset(workspace=config.workspace, kind=AssetKind.RAG_CONFIG, ref_id=config.pk)
        config.delete()


def pipeline_for(version: RagConfigVersion) -> RagPipeline:
    kb = KnowledgeBase.objects.select_related("embedding_model", "embedding_deployment").get(
        pk=version.settings["knowledge_base_id"])
    return RagPipeline(kb, version.settings)
