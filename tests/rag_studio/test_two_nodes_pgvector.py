"""Two nodes share one knowledge base on pgvector: the first node's web process takes the uploads, an ingestion worker
on a second node, with a data dir of its own, indexes them into Postgres, and the first node's web process finds them
as soon as they are done. An embedded knowledge base, whose index lives in the first node's data dir, is refused by
that worker with a message saying why, instead of being split across two disks."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from celery import current_app
from django.contrib.auth import get_user_model
from django.test import override_settings

from accounts.services import Actor, create_api_key, create_workspace
from rag_studio import services
from rag_studio.models import Document, DocumentStatus, KnowledgeBase
from serving.presets import register_presets
from tests.conftest import (
    ROOT,
    WORKER_NODE,
    consumers_paused,
    free_port,
    platform_env,
    running_server,
    stop_engines_and_flush,
    wait_for,
)
from tests.rag_studio.conftest import SAMPLES

pytestmark = [pytest.mark.worker, pytest.mark.timeout(600)]
SECOND_NODE = "node-b"


@pytest.fixture(scope="module")
def two_nodes(pgvector_url, django_db_setup, django_db_blocker, tmp_path_factory):
    """Node A: a web process on the session's data dir. Node B: an ingestion worker with a data dir of its own. Both
    on the test database, the pgvector Postgres and uploads on storage both mount."""
    port, data = free_port(), Path(os.environ["FACTORY_DATA_DIR"])
    uploads, second_data_dir = tmp_path_factory.mktemp("shared-uploads"), tmp_path_factory.mktemp("node-b-data")
    shared = {**platform_env(port), "FACTORY_RAG_PGVECTOR_URL": pgvector_url, "FACTORY_RAG_UPLOADS_DIR": str(uploads),
              "FACTORY_RAG_INDEX_BACKEND": "pgvector"}
    log = data / "worker-node-b.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues", "ingest", "--hostname",
         f"ingest@{SECOND_NODE}", "--concurrency", "1", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env={**os.environ, **shared, "FACTORY_NODE_NAME": SECOND_NODE,
                       "FACTORY_DATA_DIR": str(second_data_dir)},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    web = [sys.executable, "-m", "uvicorn", "factory.asgi:application", "--host", "127.0.0.1", "--port", str(port),
           "--lifespan", "off", "--no-access-log"]
    try:
        wait_for(lambda: worker.poll() is None and current_app.control.ping(
            destination=[f"ingest@{SECOND_NODE}"], timeout=0.5), timeout=60, what="node B's worker to answer")
        # The session's worker (node A's, if an earlier module started it) takes nothing from the line meanwhile.
        with running_server(web, health_url=f"http://127.0.0.1:{port}/healthz", log=data / "web-node-a.log",
                            env={**shared, "FACTORY_NODE_NAME": "node-a"}), \
                consumers_paused(f"pytest@{WORKER_NODE}", "ingest"), django_db_blocker.unblock(), \
                override_settings(RAG_UPLOADS_DIR=uploads, RAG_PGVECTOR_URL=pgvector_url):
            register_presets(lambda line: None)
            owner = get_user_model().objects.create_user(username="two-nodes", password="x" * 12)
            workspace = create_workspace(actor=Actor(user=owner), name="Two nodes")
            key = create_api_key(actor=Actor(user=owner), workspace=workspace, name="nodes").secret
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}/api",
                                  headers={"Authorization": f"Bearer {key}"}, timeout=60)
            yield {"client": client, "actor": Actor(user=owner), "workspace": workspace, "second": second_data_dir}
            stop_engines_and_flush()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _upload(client: httpx.Client, kb_id: int, name: str) -> int:
    response = client.post(f"/rag/knowledge-bases/{kb_id}/documents/",
                           files={"files": (name, (SAMPLES / name).read_bytes())})
    assert response.status_code == 201, response.text
    return response.json()[0]["document"]["id"]


def _settled(document_id: int) -> Document:
    def done():
        document = Document.objects.get(pk=document_id)
        return document if document.status in (DocumentStatus.INDEXED, DocumentStatus.FAILED) else None

    return wait_for(done, timeout=300, interval=0.5, what=f"document {document_id} to be ingested")


def test_a_second_nodes_worker_indexes_into_pgvector_what_the_first_nodes_web_process_finds_at_once(two_nodes):
    client = two_nodes["client"]
    created = client.post("/rag/knowledge-bases/", json={"name": "Shared handbook"})
    assert created.status_code == 201, created.text
    kb_id = created.json()["id"]
    assert created.json()["index_backend"] == "pgvector" and created.json()["index_search"] == "hnsw"

    document = _settled(_upload(client, kb_id, "northwind-support-faq.md"))
    found = client.post(f"/rag/knowledge-bases/{kb_id}/hit-test/",
                        json={"query": "Can the robot be used in a freezer warehouse?"})

    assert document.status == DocumentStatus.INDEXED, document.error
    assert {worker.split("/")[0] for worker in document.events.exclude(worker="").values_list("worker", flat=True)} \
        == {f"ingest@{SECOND_NODE}"}
    assert KnowledgeBase.objects.get(pk=kb_id).index_backend == "pgvector"
    assert found.status_code == 200, found.text
    assert any("approved for ambient warehouses only" in hit["text"] for hit in found.json()["hits"])
    # Node B wrote nothing of the index to its own disk: it is all in Postgres.
    assert not list(two_nodes["second"].glob("rag/kb-*/indexes/*/CURRENT"))


def test_a_second_nodes_worker_refuses_to_write_an_embedded_index_kept_on_the_first_node(two_nodes):
    with override_settings(RAG_INDEX_BACKEND="embedded"):
        kb = services.create_knowledge_base(actor=two_nodes["actor"], workspace=two_nodes["workspace"],
                                            name="Only on node A")

    document = _settled(_upload(two_nodes["client"], kb.pk, "northwind-support-faq.md"))

    assert document.status == DocumentStatus.FAILED and document.error_code == "index_elsewhere"
    assert f"node '{SECOND_NODE}'" in document.error and f"move_index {kb.pk} --to pgvector" in document.error
    assert not list(two_nodes["second"].glob(f"rag/kb-{kb.pk}/indexes/*"))
