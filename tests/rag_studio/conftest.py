import io
from pathlib import Path

import pytest

from accounts.services import Actor
from rag_studio import services
from rag_studio.models import Document
from rag_studio.pipeline.ingestion import ingest
from rag_studio.pipeline.storage import UploadedFile
from serving.presets import register_presets

SAMPLES = Path(__file__).resolve().parents[2] / "rag_studio" / "samples"
SAMPLE_FILES = ["northwind-employee-handbook.pdf", "northwind-product-guide.docx", "northwind-support-faq.md"]


def upload(name: str, content: bytes) -> UploadedFile:
    return UploadedFile(name, io.BytesIO(content), len(content))


def sample(name: str) -> UploadedFile:
    return upload(name, (SAMPLES / name).read_bytes())


@pytest.fixture
def presets(db):
    return register_presets(lambda line: None)


@pytest.fixture
def acme(make_workspace, presets):
    workspace = make_workspace("Acme", "ann", dev="developer", viewer="viewer")
    return workspace


@pytest.fixture
def ann(acme):
    return Actor(user=acme.memberships.get(role="owner").user)


@pytest.fixture
def indexed_kb(acme, ann):
    """A knowledge base with the three sample documents, ingested in this process."""
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Northwind")
    outcomes = services.upload_documents(actor=ann, kb=kb, uploads=[sample(name) for name in SAMPLE_FILES])
    for outcome in outcomes:
        assert ingest(outcome.document.pk, "pytest") == "indexed", Document.objects.get(pk=outcome.document.pk).error
    kb.refresh_from_db()  # as ingestion left it: its language recorded
    return kb
