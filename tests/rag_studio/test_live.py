"""RAG Studio on the real platform: ingestion on Celery workers (one of them killed mid-way), and RAG answers,
cited answers with SmolLM2 through the gateway. The LLM eval story (generated sets, runs, a judge) runs once, in
the browser tour (tests/e2e/test_rag.py)."""

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.services import Actor, create_workspace
from rag_studio import files, selectors, services
from rag_studio.evals import tuning
from rag_studio.models import Document, DocumentStatus, Stage
from rag_studio.pipeline import ingestion
from rag_studio.search.retrieval import retrieve
from rag_studio.search.retrieval_config import validate_retrieval
from rag_studio.search.stores import store_for
from rag_studio.tasks import ingest_document
from serving.presets import SMOLLM2
from tests.conftest import (
    ROOT,
    WORKER_NODE,
    consumers_paused,
    deploy_presets,
    platform_env,
    stop_engines_and_flush,
    wait_for,
)
from tests.rag_studio.conftest import SAMPLE_FILES, sample

pytestmark = pytest.mark.worker


@pytest.fixture(scope="module")
def platform(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        owner = get_user_model().objects.create_user(username="rag-owner", password="x" * 12)
        workspace = create_workspace(actor=Actor(user=owner), name="Northwind")
        yield {"url": web_server, "workspace": workspace, "actor": Actor(user=owner)}
        stop_engines_and_flush(keep=SMOLLM2)


@pytest.fixture(scope="module")
def northwind(platform, django_db_blocker):
    """The sample documents, uploaded and ingested by the platform's Celery worker."""
    with django_db_blocker.unblock():
        # The English model, named: these tests check what it retrieves (with none, the samples' mixed Chinese and
        # English would pick the multilingual one, tests/rag_studio/test_embedding_choice.py).
        kb = services.create_knowledge_base(actor=platform["actor"], workspace=platform["workspace"],
                                            name="Northwind docs", embedding_model="all-minilm-l6-v2")
        services.upload_documents(actor=platform["actor"], kb=kb, uploads=[sample(n) for n in SAMPLE_FILES])
        wait_for(lambda: kb.documents.filter(status=DocumentStatus.INDEXED).count() == 3, timeout=120,
                 what="the worker to index the samples")
        config = services.save_rag_config(actor=platform["actor"], workspace=platform["workspace"],
                                          name="Cited answers", knowledge_base=kb, template="citations",
                                          model=SMOLLM2, generation={"max_tokens": 64})
        yield {"kb": kb, "config": config}


def _killable_worker(name: str, env: dict) -> subprocess.Popen:
    log = Path(os.environ["FACTORY_DATA_DIR"]) / f"{name}.log"
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues", name, "--hostname",
         f"{name}@{WORKER_NODE}", "--concurrency", "1", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env={**os.environ, **env}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)


def _long_document(kb) -> Document:
    """About 150 chunks, stored as an upload would store it, but queued only for the killable worker."""
    paragraphs = [f"Section {i}. The NW-7 maintenance log entry {i} records a lidar check, a battery test at "
                  f"{i % 90} percent and a firmware note for warehouse aisle {i * 7 % 113}. " * 4
                  for i in range(300)]
    content = "\n\n".join(paragraphs).encode()
    sha256 = hashlib.sha256(content).hexdigest()
    path = files.upload_path(kb.pk, sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return Document.objects.create(knowledge_base=kb, filename="maintenance-log.txt", kind="text",
                                   size_bytes=len(content), sha256=sha256)


@pytest.mark.slow
def test_a_worker_killed_mid_ingestion_is_resumed_and_indexes_exactly_once(platform, web_port, live_db,
                                                                           celery_worker_process):
    kb = services.create_knowledge_base(actor=platform["actor"], workspace=platform["workspace"], name="Logs")
    document = _long_document(kb)
    env = {**platform_env(web_port), "FACTORY_RAG_EMBED_BATCH_SIZE": "4", "FACTORY_RAG_INGEST_LEASE_S": "3"}

    def embedding_half_done() -> bool:
        document.refresh_from_db()
        assert document.status != DocumentStatus.FAILED, document.error
        return document.stage == Stage.EMBED and document.progress >= 45

    # The session's worker would take the queued document from the line: the killable one must have it.
    with consumers_paused(celery_worker_process["hostname"], "ingest"):
        worker = _killable_worker("kill-test", env)
        try:
            ingest_document.apply_async(args=[document.pk], queue="kill-test")
            wait_for(embedding_half_done, timeout=120, interval=0.05, what="embedding to be under way")
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
    document.refresh_from_db()
    assert document.status == DocumentStatus.PROCESSING and document.stage == Stage.EMBED
    saved_batches = len(list(files.work_dir(document.pk).glob("vectors-*.npy")))
    assert saved_batches > 0

    # What the beat schedule does every few seconds: resume documents whose worker stopped renewing its lease.
    wait_for(lambda: timezone.now() > Document.objects.get(pk=document.pk).lease_until, timeout=10,
             what="the dead worker's lease to run out")
    assert ingestion.resume_stalled() == [document.pk]
    wait_for(lambda: Document.objects.get(pk=document.pk).status == DocumentStatus.INDEXED, timeout=180,
             what="the platform worker to finish the document")

    messages = list(document.events.values_list("message", flat=True))
    assert any(m.startswith("Resumed at the embed stage") for m in messages), messages
    assert any(m.startswith("Embedding resumes at batch") for m in messages), messages
    chunk_ids = sorted(document.chunks.filter(searchable=True).values_list("pk", flat=True))
    store = store_for(kb)
    assert sorted(store.chunk_ids(str(document.pk))) == chunk_ids
    assert store.count() == len(chunk_ids)
    assert len({hit[0] for hit in store.search_keyword("lidar battery firmware", 1000)}) == len(chunk_ids)


def test_a_rag_config_answers_with_citations_through_the_gateway(northwind, live_db):
    version = selectors.config_version(northwind["config"])
    result = services.pipeline_for(version).run("How many days of annual leave do employees get?")
    assert result.answer.strip()
    assert result.hits[0].filename == "northwind-employee-handbook.pdf"
    citations = result.citations()
    assert citations and {"n", "chunk_id", "document", "page", "score"} <= set(citations[0])
    assert result.usage.get("output_tokens", 0) > 0


def test_an_llm_rerank_rates_every_candidate_through_the_gateway(northwind, live_db):
    settings = {"mode": "hybrid", "candidates": 6, "top_k": 6,
                "rerank": {"kind": "llm", "model": SMOLLM2, "top_k": 3, "threshold": 0.0}}
    question = "How many days of annual leave do employees get?"
    unranked = {**settings, "rerank": {**settings["rerank"], "kind": "none"}}
    candidates = len(retrieve(northwind["kb"], question, unranked).hits)
    result = retrieve(northwind["kb"], question, settings)

    # Each candidate was rated (0 or more) or counted as unparseable; rerank.top_k are kept, best first.
    assert len(result.hits) == min(3, candidates - result.rerank_unparseable)
    scores = [hit.rerank for hit in result.hits]
    assert all(score is not None for score in scores) and scores == sorted(scores, reverse=True)
    assert all(hit.fused is not None for hit in result.hits)


def test_a_tuning_trial_that_rewrites_the_question_searches_deeper_for_a_held_out_questions_hidden_chunks(
        northwind, live_db):
    settings = {"rewrite_model": SMOLLM2, "retrieval": validate_retrieval({"mode": "hybrid", "top_k": 3})}
    search = tuning._searcher(northwind["kb"], settings)
    question = "How many days of annual leave do employees get?"

    # The question rewritten by the model through the gateway, its queries' hits fused: 3, or 3 more than the
    # chunks a held-out question hides from them (the samples have more than 5 chunks).
    assert len(search(question)) == 3
    assert len(search(question, 2)) == 5


def test_the_run_api_answers_over_http_while_the_same_process_serves_the_gateway(platform, northwind, live_db):
    """A sync API view calling the gateway in its own web process must not wait on itself."""
    import httpx

    from accounts.services import create_api_key

    key = create_api_key(actor=platform["actor"], workspace=platform["workspace"], name="run").secret
    response = httpx.post(f"{platform['url']}/api/rag/configs/{northwind['config'].pk}/run/",
                          json={"query": "What does error code E204 mean?"},
                          headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["answer"].strip() and body["version"] == 1
    assert body["citations"][0]["document"] == "northwind-product-guide.docx"
