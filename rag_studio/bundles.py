"""A RAG config as a signed bundle (see assets.bundles for the envelope): the config version's settings, its
knowledge base's settings, the original documents and, optionally, the index, so that another workspace or
instance gets the same assistant, searchable at once when the index comes along.

Manifest entries and files:

    entries[kind=knowledge_base]   name, checksum (its asset version's), settings, documents, index
        settings    description, embedding_model, embedding_dimensions, embedding_deployment, chunking,
                    screening, retrieval
        documents   [{filename, kind, sha256, size, file, status, ingested?}]; `ingested` (page, char and chunk
                    counts, screening findings) only for documents whose chunks and vectors are in the bundle
        index       null, or {chunks, vectors, embedding_model, dimensions, indexed_with, chunk_count, vector_count}
    entries[kind=rag_config]       name, version, checksum, settings (template, model, prompt, retrieval,
                                   generation)
    app                            the exporter's `extra` (runtime's published app), when given
    documents/<filename>           each original upload
    index/chunks.jsonl             one chunk a line: document sha256, ordinal, text, page, start, end, heading,
                                   parent (ordinal), searchable
    index/vectors.npy              float32 [searchable chunks, dimension]: row i is the i-th searchable line

The index travels as chunks and vectors rather than as the FAISS/BM25 generation files: those are keyed by chunk
primary keys, which are new in the importing database, so the import writes a fresh generation through IndexStore
(which rebuilds the keyword index from the chunk texts). The .npy file is read without pickles.

An import never holds the database's write lock for longer than it takes to write rows. It copies (and hashes) the
documents into a staging dir first, with no transaction open, because on SQLite a transaction holding gigabytes of
copies makes every other writer (ingestion, the GUI) give up after its 30 s timeout. One short transaction then
creates every row and moves the staged files into place (renames); if anything in it fails, the rows roll back and
the files are removed. The indexed documents' vectors are written last, through the ingestion pipeline's own
index stage: the documents wait in that stage under the importer's lease, so if the process dies they resume like
any other document, and nothing is marked indexed before its chunks are in the index.
"""

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils.text import slugify

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from assets.bundles import Bundle, BundleRejected, ImportOutcome, bundle_importer, read_bundle, write_bundle
from assets.models import Asset, AssetKind
from cluster import leases
from rag_studio import files, selectors, services
from rag_studio.models import Chunk, Document, DocumentEvent, DocumentStatus, Finding, KnowledgeBase, RagConfig, Stage
from rag_studio.pipeline import ingestion
from rag_studio.pipeline.parsing import ParseError, file_kind
from rag_studio.pipeline.storage import is_stored
from rag_studio.search.stores import store_for
from serving.models import RoleHint
from serving.selectors import chat_model_problem, deployments_visible_to, models_visible_to

CONFIG_BUNDLE = "rag_config"
APP_BUNDLE = "app"  # a config bundle that also carries a published app (runtime's `extra`)
CHUNKS_FILE = "index/chunks.jsonl"
VECTORS_FILE = "index/vectors.npy"
CONFIG_FIELDS = ("template", "model", "prompt", "retrieval", "generation")
FINDING_FIELDS = ("category", "kind", "action", "page", "start", "end", "preview")


@dataclass
class ExportedBundle:
    path: Path  # a temporary file: the caller sends it and removes it
    filename: str  # what to download it as
    manifest: dict


def export_config_bundle(*, actor: Actor, config: RagConfig, version_number: int | None = None,
                         include_indexes: bool = False, extra: dict | None = None) -> ExportedBundle:
    """Write a signed bundle of a config version (the latest by default) with its knowledge base and documents,
    and with `include_indexes` its chunks and vectors. `extra` goes under manifest["app"] untouched."""
    require_role(actor=actor, workspace=config.workspace, role=Role.DEVELOPER)
    version = selectors.config_version(config, version_number)
    kb = KnowledgeBase.objects.select_related("workspace", "embedding_model", "embedding_deployment").filter(
        pk=version.settings["knowledge_base_id"], workspace=config.workspace).first()
    if kb is None:
        raise Conflict(f"Version {version.number} of '{config.name}' uses a knowledge base that was deleted.")
    if include_indexes and kb.building_key:
        raise Conflict(f"'{kb.name}' is being re-indexed: export it with its index when that is done, or without.")
    kb_asset = services.register_kb_asset(kb, actor=actor)
    stored = [d for d in kb.documents.order_by("pk") if is_stored(kb.pk, d.sha256)]
    scratch = Path(tempfile.mkdtemp(prefix="export-", dir=_exports_dir()))
    try:
        bundle_files, index, ingested = (_index_files(kb, stored, scratch) if include_indexes else ({}, None, {}))
        documents = []
        for document in stored:
            path = _document_path(document.filename, bundle_files)
            bundle_files[path] = files.upload_path(kb.pk, document.sha256)
            documents.append({"filename": document.filename, "kind": document.kind, "sha256": document.sha256,
                              "size": document.size_bytes, "file": path, "status": document.status,
                              **({"ingested": ingested[document.pk]} if document.pk in ingested else {})})
        entries = [
            {"kind": AssetKind.KNOWLEDGE_BASE.value, "name": kb.name, "checksum": kb_asset.checksum,
             "settings": _kb_settings(kb), "documents": documents, "index": index},
            {"kind": AssetKind.RAG_CONFIG.value, "name": config.name, "version": version.number,
             "checksum": version.checksum, "settings": {key: version.settings[key] for key in CONFIG_FIELDS}},
        ]
        written = scratch / "bundle.zip"
        manifest = write_bundle(written, kind=APP_BUNDLE if extra is not None else CONFIG_BUNDLE, entries=entries,
                                files=bundle_files, sections={"app": extra} if extra is not None else None)
        target = _exports_dir() / f"{scratch.name}.zip"
        os.replace(written, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record_audit(actor=actor, workspace=config.workspace, action="rag.config.export", target=config,
                 detail={"version": version.number, "documents": len(documents), "with_index": index is not None})
    return ExportedBundle(path=target, filename=f"{slugify(config.name) or 'rag-config'}-v{version.number}.bundle.zip",
                          manifest=manifest)


def _exports_dir() -> Path:
    directory = settings.DATA_DIR / "exports"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _kb_settings(kb: KnowledgeBase) -> dict:
    return {"description": kb.description, "embedding_model": kb.embedding_model.name,
            "embedding_dimensions": kb.embedding_dimensions,
            "embedding_deployment": kb.embedding_deployment.name if kb.embedding_deployment else "",
            "chunking": kb.chunking, "screening": kb.screening, "ocr": kb.ocr, "retrieval": kb.retrieval,
            "keyword_terms": kb.keyword_terms}


def _document_path(filename: str, taken: dict) -> str:
    """documents/<filename>: one path segment (no slashes, backslashes or control characters), unique in the
    bundle."""
    name = "".join("_" if char in "/\\" or ord(char) < 32 else char for char in filename).strip()
    if name in ("", ".", ".."):
        name = "document"
    stem, dot, suffix = name.rpartition(".") if "." in name.lstrip(".") else (name, "", "")
    path, n = f"documents/{name}", 2
    while path in taken:
        path, n = f"documents/{stem} ({n}){dot}{suffix}", n + 1
    return path


def _index_files(kb: KnowledgeBase, documents: list[Document], scratch: Path) -> tuple[dict, dict, dict]:
    """Write the chunks and vectors of every indexed document whose index entry matches its chunks. Returns the
    bundle files, the index entry, and each such document's `ingested` summary by document id."""
    store = store_for(kb)
    chunks_path, vectors_path = scratch / "chunks.jsonl", scratch / "vectors.npy"
    indexed_ids, ingested, chunk_count = [], {}, 0
    with chunks_path.open("w", encoding="utf-8") as out:
        for document in documents:
            if document.status != DocumentStatus.INDEXED:
                continue
            rows = list(document.chunks.order_by("ordinal").values(
                "id", "ordinal", "text", "page", "start", "end", "heading", "parent_id", "searchable"))
            searchable = [row["id"] for row in rows if row["searchable"]]
            if not searchable or sorted(store.chunk_ids(str(document.pk))) != sorted(searchable):
                continue  # its chunks changed since they were indexed: the importer ingests it again instead
            indexed_ids += searchable
            ordinal_of = {row["id"]: row["ordinal"] for row in rows}
            for row in rows:
                line = {"document": document.sha256, "parent": ordinal_of.get(row["parent_id"]),
                        **{key: row[key] for key in ("ordinal", "text", "page", "start", "end", "heading",
                                                     "searchable")}}
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
            chunk_count += len(rows)
            ingested[document.pk] = {
                "page_count": document.page_count, "char_count": document.char_count,
                "chunk_count": document.chunk_count,
                "findings": list(document.findings.values(*FINDING_FIELDS))}
    try:
        vectors = store.vectors(indexed_ids)  # one lookup for the whole knowledge base
    except KeyError:
        raise Conflict(f"'{kb.name}' was being written to while it was exported; export it again.")
    np.save(vectors_path, vectors)
    index = {"chunks": CHUNKS_FILE, "vectors": VECTORS_FILE, "embedding_model": kb.embedding_model.name,
             "dimensions": kb.embedding_dimensions, "indexed_with": kb.indexed_with, "chunk_count": chunk_count,
             "vector_count": len(vectors)}
    return {CHUNKS_FILE: chunks_path, VECTORS_FILE: vectors_path}, index, ingested


@dataclass
class ImportResult:
    kb: KnowledgeBase
    config: RagConfig
    extra: dict | None  # manifest["app"], for the caller that exported it
    index_restored: bool
    notes: list[str] = field(default_factory=list)


ExtraHandler = Callable[[RagConfig, dict | None], None]


def import_config_bundle(*, actor: Actor, workspace: Workspace, file,
                         on_extra: ExtraHandler | None = None) -> ImportResult:
    """Verify a bundle, then import it into `workspace` as a new knowledge base and RAG config, all or nothing.
    `on_extra(config, extra)` runs inside the same transaction, so the caller's own rows (an app) share its fate.
    Call it outside any transaction: files it wrote are removed only when its own transaction fails."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    with read_bundle(file) as bundle:
        return import_verified_bundle(actor=actor, workspace=workspace, bundle=bundle, on_extra=on_extra)


@bundle_importer(CONFIG_BUNDLE)
def _import_for_assets(*, actor: Actor, workspace: Workspace, bundle: Bundle) -> ImportOutcome:
    result = import_verified_bundle(actor=actor, workspace=workspace, bundle=bundle)
    imported = Asset.objects.filter(Q(kind=AssetKind.KNOWLEDGE_BASE, ref_id=str(result.kb.pk))
                                    | Q(kind=AssetKind.RAG_CONFIG, ref_id=str(result.config.pk)), workspace=workspace)
    return ImportOutcome(assets=list(imported), notes=result.notes)


def import_verified_bundle(*, actor: Actor, workspace: Workspace, bundle: Bundle,
                           on_extra: ExtraHandler | None = None) -> ImportResult:
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    if bundle.kind not in (CONFIG_BUNDLE, APP_BUNDLE):
        raise BundleRejected(f"it is a {bundle.kind!r} bundle, not a RAG config")
    plan = _Plan.read(bundle)
    _require_chat_deployment(workspace, plan.config_settings["model"])
    notes = []
    embedding_model, embedding_deployment = _embedding_choice(workspace, plan.kb_settings, notes)
    owner = f"import/{os.getpid()}/{uuid.uuid4().hex[:12]}"
    staging = _staging_dir()
    kb_dir = None
    try:
        staged = {entry["sha256"]: _stage_document(bundle, entry, staging) for entry in plan.documents}
        index = _read_index(bundle, plan.index) if plan.index is not None else None
        with transaction.atomic():  # rows only, and renames: the copies are done
            kb = services.create_knowledge_base(
                actor=actor, workspace=workspace, name=_free_name(workspace.knowledge_bases, plan.kb_name),
                description=plan.kb_settings.get("description", ""), embedding_model=embedding_model,
                embedding_deployment=embedding_deployment, chunking=plan.kb_settings.get("chunking"),
                screening=plan.kb_settings.get("screening"), ocr=plan.kb_settings.get("ocr"),
                retrieval=plan.kb_settings.get("retrieval"), keyword_terms=plan.kb_settings.get("keyword_terms"))
            kb_dir = files.kb_dir(kb.pk)
            restore = _can_restore(kb, plan.index, notes)
            documents = _import_documents(bundle, kb, plan, staged, restore, owner)
            vectors = _restore_chunks(kb, plan.index, index, documents) if restore else []
            config = services.save_rag_config(
                actor=actor, workspace=workspace, name=_free_name(workspace.rag_configs, plan.config_name),
                knowledge_base=kb, **plan.config_settings)
            services.register_kb_asset(kb, actor=actor)
            extra = bundle.manifest.get("app")
            record_audit(actor=actor, workspace=workspace, action="rag.bundle.import", target=config,
                         detail={"signer": bundle.signer, "knowledge_base": kb.name, "documents": len(documents),
                                 "index_restored": restore})
            if on_extra is not None:
                on_extra(config, extra)
            queued = [d.pk for d in documents.values() if d.status == DocumentStatus.QUEUED]
            transaction.on_commit(lambda: ingestion.dispatch_ingest(queued))
    except BaseException:
        if kb_dir is not None:
            shutil.rmtree(kb_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if vectors:
        ingestion.index_with_vectors(vectors, owner)
        kb.indexed_with = plan.index.get("indexed_with") or selectors.index_settings(kb)
        kb.save(update_fields=["indexed_with", "updated_at"])
        failed = kb.documents.filter(status=DocumentStatus.FAILED)
        if failed.exists():
            notes.append(f"{failed.count()} document(s) could not be indexed ({failed.first().error}); retry them "
                         f"on the knowledge base's page.")
    return ImportResult(kb=kb, config=config, extra=extra, index_restored=restore, notes=notes)


STAGING_KEPT_S = 24 * 3600


def _staging_dir() -> Path:
    """A fresh dir for this import's copies, on the data dir's filesystem so that moving them into place is a
    rename. Dirs of imports whose process died are removed a day later."""
    root = settings.DATA_DIR / "imports"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.iterdir():
        if time.time() - stale.stat().st_mtime > STAGING_KEPT_S:
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix="import-", dir=root))


def _stage_document(bundle: Bundle, entry: dict, staging: Path) -> Path:
    target = staging / entry["sha256"]
    if not target.exists():
        bundle.copy_to(entry["file"], target)
    return target


@dataclass
class _Plan:
    """The manifest's knowledge base and config, checked for shape before anything is created."""

    kb_name: str
    kb_settings: dict
    documents: list[dict]
    index: dict | None
    config_name: str
    config_settings: dict

    @classmethod
    def read(cls, bundle: Bundle) -> "_Plan":
        kb, config = bundle.entry(AssetKind.KNOWLEDGE_BASE), bundle.entry(AssetKind.RAG_CONFIG)
        kb_settings, config_settings = kb.get("settings"), config.get("settings")
        documents, index = kb.get("documents"), kb.get("index")
        if not (isinstance(kb_settings, dict) and isinstance(kb_settings.get("embedding_model"), str)
                and isinstance(documents, list) and all(isinstance(d, dict) for d in documents)
                and (index is None or isinstance(index, dict)) and isinstance(kb.get("name"), str)):
            raise BundleRejected("its knowledge base entry is malformed")
        if not (isinstance(config_settings, dict) and isinstance(config.get("name"), str)
                and all(isinstance(config_settings.get(key), str) for key in ("template", "model", "prompt"))
                and all(isinstance(config_settings.get(key), dict) for key in ("retrieval", "generation"))):
            raise BundleRejected("its RAG config entry is malformed")
        listed, seen = bundle.manifest["files"], set()
        if index is not None and not all(isinstance(index.get(key), str) and index[key] in listed
                                         for key in ("chunks", "vectors")):
            raise BundleRejected("its index entry does not name its chunk and vector files")
        for document in documents:
            path, sha256, name = document.get("file"), document.get("sha256"), document.get("filename")
            if not isinstance(path, str) or path not in listed or listed[path]["sha256"] != sha256:
                raise BundleRejected(f"document {name!r} does not match its file {path}")
            if sha256 in seen:
                raise BundleRejected(f"document {name!r} is listed twice")
            if "ingested" in document and not _valid_ingested(document["ingested"]):
                raise BundleRejected(f"document {name!r} has a malformed ingestion summary")
            seen.add(sha256)
        return cls(kb_name=kb["name"], kb_settings=kb_settings, documents=documents, index=index,
                   config_name=config["name"],
                   config_settings={key: config_settings[key] for key in CONFIG_FIELDS})


def _valid_ingested(ingested) -> bool:
    return (isinstance(ingested, dict)
            and all(type(ingested.get(key)) is int for key in ("page_count", "char_count", "chunk_count"))
            and isinstance(ingested.get("findings"), list)
            and all(isinstance(finding, dict) and set(FINDING_FIELDS) <= set(finding)
                    for finding in ingested["findings"]))


def _require_chat_deployment(workspace: Workspace, name: str) -> None:
    """The config answers through a deployment by name; importing one that cannot answer here helps nobody."""
    if chat_model_problem(workspace=workspace, name=name):
        raise ValidationFailed(
            f"The bundle's RAG config answers with the deployment '{name}', which does not exist here (or cannot "
            f"chat). Deploy a chat model under that name on Models & Serving, then import again.",
            fields={"model": [f"No chat deployment named '{name}'."]})


def _embedding_choice(workspace: Workspace, kb_settings: dict, notes: list[str]) -> tuple[str, str]:
    """(embedding model, embedding deployment) for the new knowledge base: the bundle's where this instance has
    them, else the default model, whose different vectors mean the documents are ingested again."""
    name = kb_settings["embedding_model"]
    if not models_visible_to(workspace=workspace).filter(name=name, role_hint=RoleHint.EMBEDDING).exists():
        notes.append(f"The embedding model '{name}' is not registered here, so the knowledge base uses "
                     f"'{services.DEFAULT_EMBEDDING_MODEL}' and its documents are ingested again.")
        return services.DEFAULT_EMBEDDING_MODEL, ""
    deployment = kb_settings.get("embedding_deployment") or ""
    if deployment and not deployments_visible_to(workspace=workspace).filter(name=deployment,
                                                                              model__name=name).exists():
        notes.append(f"There is no embedding deployment '{deployment}' here; '{name}' runs in the worker instead.")
        deployment = ""
    return name, deployment


def _can_restore(kb: KnowledgeBase, index: dict | None, notes: list[str]) -> bool:
    if index is None:
        return False
    if (index.get("embedding_model"), index.get("dimensions")) != (kb.embedding_model.name, kb.embedding_dimensions):
        notes.append(f"The bundle's index was built with '{index.get('embedding_model')}' "
                     f"({index.get('dimensions')} dimensions), not '{kb.embedding_model.name}' "
                     f"({kb.embedding_dimensions}): its documents are ingested again instead.")
        return False
    return True


def _free_name(existing, name: str) -> str:
    """`name`, or `name (imported)`, `name (imported 2)`… whichever is free in the workspace."""
    base = name.strip()[:80] or "Imported"
    candidate, n = base, 1
    while existing.filter(name=candidate).exists():
        candidate = f"{base} (imported)" if n == 1 else f"{base} (imported {n})"
        n += 1
    return candidate


def _import_documents(bundle: Bundle, kb: KnowledgeBase, plan: _Plan, staged: dict[str, Path], restore: bool,
                      owner: str) -> dict[str, Document]:
    """Move each staged document into storage and create its row: queued for ingestion, or, when its chunks come
    along, waiting at the embed stage under the importer's lease (see `import_verified_bundle`)."""
    files.uploads_dir(kb.pk).mkdir(parents=True, exist_ok=True)
    documents, events, findings = {}, [], []
    for entry in plan.documents:
        filename = Path(str(entry.get("filename") or "document")).name[:255] or "document"
        try:
            kind = file_kind(filename)
        except ParseError as exc:
            raise BundleRejected(f"document {filename!r} cannot be ingested here: {exc.reason}")
        os.replace(staged[entry["sha256"]], files.upload_path(kb.pk, entry["sha256"]))
        ingested = entry.get("ingested") if restore else None
        document = Document(knowledge_base=kb, filename=filename, kind=kind, size_bytes=bundle.size(entry["file"]),
                            sha256=entry["sha256"])
        if ingested:
            document.status, document.stage, document.progress = (
                DocumentStatus.PROCESSING, Stage.EMBED, ingestion.PROGRESS_AT[Stage.EMBED])
            document.lease_owner, document.attempts = owner, 1
            document.lease_until = leases.lease_until(settings.RAG_INGEST_LEASE_S)
            document.chunk_set = uuid.uuid4().hex
            document.page_count, document.char_count, document.chunk_count = (
                ingested["page_count"], ingested["char_count"], ingested["chunk_count"])
        document.save()
        documents[entry["sha256"]] = document
        message = "Imported with its index" if ingested else "Imported and queued"
        events.append(DocumentEvent(document=document, stage=document.stage,
                                    message=f"{message} (bundle signed by {bundle.signer})"))
        findings += [Finding(document=document, **{key: finding[key] for key in FINDING_FIELDS})
                     for finding in (ingested or {}).get("findings", [])]
    DocumentEvent.objects.bulk_create(events)
    Finding.objects.bulk_create(findings)
    return documents


@dataclass
class _Index:
    lines: list[dict]
    vectors: np.ndarray


def _read_index(bundle: Bundle, index: dict) -> _Index:
    lines = _chunk_lines(bundle, index["chunks"])
    with bundle.open(index["vectors"]) as stream:
        try:
            vectors = np.lib.format.read_array(stream, allow_pickle=False)
        except ValueError as exc:
            raise BundleRejected(f"{index['vectors']} is not a vector array ({exc})")
    return _Index(lines, vectors)


def _restore_chunks(kb: KnowledgeBase, entry: dict, index: _Index,
                    documents: dict[str, Document]) -> list[tuple[Document, np.ndarray]]:
    """Recreate the indexed documents' chunks; returns each document with its searchable chunks' vectors, in
    ordinal order (the order the pipeline indexes them in)."""
    lines, vectors = index.lines, index.vectors
    searchable = sum(1 for line in lines if line["searchable"])
    if vectors.shape != (searchable, kb.embedding_dimensions):
        raise BundleRejected(f"{entry['vectors']} holds {vectors.shape} vectors for {searchable} searchable chunks "
                             f"of {kb.embedding_dimensions} dimensions")
    by_document: dict[str, list[tuple[dict, np.ndarray | None]]] = {}
    row = 0
    for line in lines:
        vector = None
        if line["searchable"]:
            vector, row = vectors[row], row + 1
        by_document.setdefault(line["document"], []).append((line, vector))
    indexed_documents = {sha256 for sha256, d in documents.items() if d.status == DocumentStatus.PROCESSING}
    if set(by_document) != indexed_documents:
        raise BundleRejected(f"{entry['chunks']} does not hold the chunks of exactly the documents marked indexed")
    restored = []
    for sha256, document_lines in by_document.items():
        document = documents[sha256]
        ordinals = {line["ordinal"] for line, _ in document_lines}
        if len(ordinals) != len(document_lines) or any(
                line["parent"] is not None and line["parent"] not in ordinals for line, _ in document_lines):
            raise BundleRejected(f"{entry['chunks']}: the chunks of {document.filename!r} have repeated ordinals "
                                 f"or missing parents")
        document_lines.sort(key=lambda pair: pair[0]["ordinal"])
        rows = Chunk.objects.bulk_create([
            Chunk(knowledge_base=kb, document=document, ordinal=line["ordinal"], text=line["text"],
                  page=line["page"], start=line["start"], end=line["end"], heading=line["heading"][:500],
                  searchable=line["searchable"]) for line, _ in document_lines])
        by_ordinal = {row.ordinal: row for row in rows}
        children = []
        for chunk, (line, _) in zip(rows, document_lines):
            if line["parent"] is not None:
                chunk.parent = by_ordinal[line["parent"]]
                children.append(chunk)
        Chunk.objects.bulk_update(children, ["parent"])
        document_vectors = [vector for _, vector in document_lines if vector is not None]
        restored.append((document, np.stack(document_vectors) if document_vectors
                         else np.empty((0, kb.embedding_dimensions), np.float32)))
    return restored


def _chunk_lines(bundle: Bundle, path: str) -> list[dict]:
    lines = []
    with bundle.open(path) as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                line = json.loads(raw)
                for key, kind in (("document", str), ("ordinal", int), ("text", str), ("start", int), ("end", int),
                                  ("heading", str), ("searchable", bool)):
                    if not isinstance(line[key], kind):
                        raise TypeError(key)
                if not (line["page"] is None or isinstance(line["page"], int)) or not (
                        line["parent"] is None or isinstance(line["parent"], int)):
                    raise TypeError("page or parent")
            except (ValueError, KeyError, TypeError):
                raise BundleRejected(f"{path} line {number} is malformed")
            lines.append(line)
    return lines
