"""Event logs (a document's ingestion log, a deployment's history, a job's events) are stored once, in English,
by workers that have no reader's language, and read in the reader's: the Chinese pages show them in Chinese, with
the values they carry (a worker, an address) as written, and rows stored before a page asked for them read in
Chinese too."""

import pytest
from django.conf import settings
from django.test import Client

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from rag_studio import services as rag_services
from rag_studio.models import DocumentEvent
from rag_studio.pipeline.ingestion import ingest
from serving.models import ServingEvent
from serving.presets import SMOLLM2
from serving.services import _set_replica_state, create_deployment
from tests.i18n.english import english_sentences
from tests.rag_studio.conftest import acme, ann, presets, sample  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader(ann) -> Client:  # noqa: F811
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    client.login(username="ann", password="correct-horse-battery")
    return client


def _log(page: str) -> list[str]:
    from bs4 import BeautifulSoup

    return [cell.get_text() for cell in BeautifulSoup(page, "lxml").select(".log-message")]


def test_a_documents_ingestion_log_reads_in_chinese(reader, ann, acme):  # noqa: F811
    kb = rag_services.create_knowledge_base(actor=ann, workspace=acme, name="手册")
    document = rag_services.upload_documents(actor=ann, kb=kb, uploads=[sample("northwind-support-faq.md")])[0].document
    assert ingest(document.pk, "worker-7") == "indexed"
    document.refresh_from_db()
    stored = list(DocumentEvent.objects.filter(document=document).values_list("message", flat=True))
    assert stored[0] == "Uploaded and queued" and stored[-1] == f"Indexed {document.chunk_count} chunk(s)"

    log = _log(reader.get(f"/rag/documents/{document.pk}/").content.decode())

    assert log[0] == "已上传并排队" and log[-1] == f"已索引 {document.chunk_count} 个分块"
    assert not [sentence for line in log for sentence in english_sentences(line)]


def test_a_deployments_history_reads_in_chinese_with_its_values_as_written(reader, presets, acme):  # noqa: F811
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    deployment = create_deployment(actor=SYSTEM, workspace=None, model=presets[SMOLLM2], name=SMOLLM2,
                                   replicas=[(node, 1.0)])
    replica = deployment.replicas.get()
    # As the engine's worker writes it once the engine answers.
    _set_replica_state(replica, "ready", "Engine pid 4242 answers at http://10.0.0.7:8081; tool calls: native")
    assert ServingEvent.objects.filter(deployment=deployment, message="Created with 1 replica(s)").exists()

    page = reader.get(f"/serving/deployments/{SMOLLM2}/").content.decode()
    log = _log(page)

    assert "已创建，含 1 个副本" in log
    assert "引擎进程 4242 在 http://10.0.0.7:8081 响应；工具调用方式：native" in log
    assert '<span class="log-value">http://10.0.0.7:8081</span>' in page


def test_a_message_of_no_known_template_is_shown_as_stored(reader, presets, acme):  # noqa: F811
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    deployment = create_deployment(actor=SYSTEM, workspace=None, model=presets[SMOLLM2], name=SMOLLM2,
                                   replicas=[(node, 1.0)])
    _set_replica_state(deployment.replicas.get(), "failed", "llama-server: error: <unknown argument>")

    log = _log(reader.get(f"/serving/deployments/{SMOLLM2}/").content.decode())

    assert "llama-server: error: <unknown argument>" in log
