"""Ingestion leases, in one process: a worker that lost its document never undoes the work of the one that took it
over, a document never fails for a race or a lost file, stalled and lost work is dispatched again, and work that
keeps stopping fails with the reason after RAG_INGEST_MAX_ATTEMPTS. (A queued document has no message of its own to
lose: tests/rag_studio/test_line.py.)"""

import threading
from datetime import timedelta

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from cluster.leases import owner_name
from rag_studio import files, services
from rag_studio.models import Document, DocumentStatus, Stage
from rag_studio.pipeline import ingestion
from rag_studio.pipeline.ingestion import ingest
from rag_studio.search.retrieval import retrieve
from rag_studio.search.stores import store_for
from tests.rag_studio.conftest import sample, upload


@pytest.fixture(autouse=True)
def dispatched(monkeypatch) -> list[int]:
    """The document ids whose task would be sent; nothing reaches Redis, these tests run the tasks themselves."""
    ids = []
    monkeypatch.setattr(ingestion, "dispatch_ingest", ids.extend)
    return ids


def _index_matches_chunks(kb, document: Document) -> bool:
    kb.refresh_from_db()  # the first embedding may have picked another model, whose index has a key of its own
    chunk_ids = sorted(document.chunks.filter(searchable=True).values_list("pk", flat=True))
    return bool(chunk_ids) and sorted(store_for(kb).chunk_ids(str(document.pk))) == chunk_ids


def test_every_process_and_task_holds_its_leases_under_its_own_name():
    """Celery gives both pool processes of a worker the same hostname; a lease owner named after it alone let two
    processes take the same document at once."""
    names = {owner_name("worker@node-1", "task-a"), owner_name("worker@node-1", "task-b")}
    assert len(names) == 2 and all(name.startswith("worker@node-1/") for name in names)


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_lost_its_lease_leaves_the_new_holders_chunks_alone(acme, ann, monkeypatch):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Race")
    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[sample("northwind-support-faq.md")])
    document_id = outcome.document.pk
    paused, resume = threading.Event(), threading.Event()
    run_chunk = ingestion.STAGES[Stage.CHUNK]

    def chunk_after_a_pause(document, worker):
        if worker == "worker-a":  # worker A stalls here, past its lease (a long GC pause, a stopped VM)
            paused.set()
            resume.wait(60)
        return run_chunk(document, worker)

    monkeypatch.setitem(ingestion.STAGES, Stage.CHUNK, chunk_after_a_pause)
    outcomes = []
    stalled = threading.Thread(target=lambda: outcomes.append(ingest(document_id, "worker-a")))
    stalled.start()
    assert paused.wait(60)
    Document.objects.filter(pk=document_id).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert ingest(document_id, "worker-b") == DocumentStatus.INDEXED
    resume.set()
    stalled.join(60)

    document = Document.objects.get(pk=document_id)
    assert document.status == DocumentStatus.INDEXED and outcomes == [DocumentStatus.INDEXED]
    assert _index_matches_chunks(kb, document)
    assert retrieve(kb, "保修期是多久？").hits[0].filename == "northwind-support-faq.md"


def test_a_document_whose_saved_vectors_vanished_is_embedded_again_not_failed(acme, ann, monkeypatch):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Vanished")
    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[sample("northwind-support-faq.md")])
    embed = ingestion.GROUP_STAGES[Stage.EMBED]

    def embed_then_lose_the_vectors(documents, worker, **options):
        embed(documents, worker, **options)
        if not Document.objects.filter(pk=outcome.document.pk, events__message__contains="embedding again"):
            for path in files.work_dir(outcome.document.pk).glob("vectors-*.npy"):
                path.unlink()  # another worker's clean-up, a disk clean-up: gone before the index stage

    monkeypatch.setitem(ingestion.GROUP_STAGES, Stage.EMBED, embed_then_lose_the_vectors)

    assert ingest(outcome.document.pk, "pytest") == DocumentStatus.INDEXED
    document = Document.objects.get(pk=outcome.document.pk)
    assert any("embedding again" in message for message in document.events.values_list("message", flat=True))
    assert _index_matches_chunks(kb, document)


def test_a_document_whose_work_files_are_gone_starts_again_from_the_upload(acme, ann):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Emptied")
    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[sample("northwind-product-guide.docx")])
    Document.objects.filter(pk=outcome.document.pk).update(stage=Stage.CHUNK)  # as if parse..screen had run

    assert ingest(outcome.document.pk, "pytest") == DocumentStatus.INDEXED
    assert _index_matches_chunks(kb, Document.objects.get(pk=outcome.document.pk))


def test_a_document_that_keeps_stopping_fails_with_the_stage_after_the_attempts(acme, ann, settings):
    settings.RAG_INGEST_MAX_ATTEMPTS = 3
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Doomed")
    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[upload("notes.txt", b"A line of notes.")])
    # Three workers took it and died in the parse stage (their leases ran out).
    Document.objects.filter(pk=outcome.document.pk).update(
        status=DocumentStatus.PROCESSING, attempts=3, lease_owner="worker@n/41/t3",
        lease_until=timezone.now() - timedelta(seconds=1))

    assert ingestion.resume_stalled() == [outcome.document.pk]
    assert ingest(outcome.document.pk, "worker@n/42/t4") == DocumentStatus.FAILED
    document = Document.objects.get(pk=outcome.document.pk)
    assert document.error_code == "too_many_attempts"
    assert "stopped 3 times in the parse stage" in document.error
    retried = services.retry_document(actor=ann, document=document)
    assert (retried.status, retried.attempts) == (DocumentStatus.QUEUED, 0)


def test_a_queued_document_can_be_retried_by_hand(acme, ann, key_client):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Stuck")
    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[upload("a.txt", b"Alpha text.")])

    response = key_client("ann", acme).post(f"/api/rag/documents/{outcome.document.pk}/retry/")

    assert response.status_code == 200, response.json()
    assert response.json()["status"] == DocumentStatus.QUEUED


def test_a_task_stopped_at_its_time_limit_resumes_where_it_stopped(acme, ann, monkeypatch):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Slow")
    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[sample("northwind-support-faq.md")])
    embed = ingestion.GROUP_STAGES[Stage.EMBED]

    def out_of_time(documents, worker, **options):
        raise SoftTimeLimitExceeded()  # what Celery raises in the task at its soft time limit

    monkeypatch.setitem(ingestion.GROUP_STAGES, Stage.EMBED, out_of_time)
    assert ingest(outcome.document.pk, "worker@n/1/t1") == "timed out"
    document = Document.objects.get(pk=outcome.document.pk)
    assert (document.status, document.stage) == (DocumentStatus.PROCESSING, Stage.EMBED)
    assert document.lease_until <= timezone.now()
    assert ingestion.resume_stalled() == [document.pk]

    monkeypatch.setitem(ingestion.GROUP_STAGES, Stage.EMBED, embed)
    assert ingest(document.pk, "worker@n/2/t2") == DocumentStatus.INDEXED
    messages = list(Document.objects.get(pk=document.pk).events.values_list("message", flat=True))
    assert any(m.startswith("Stopped at the task's time limit") for m in messages)
    assert any(m.startswith("Resumed at the embed stage") for m in messages)
