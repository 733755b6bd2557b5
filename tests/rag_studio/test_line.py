"""Issue 31: the ingestion line. Workspaces take turns whatever their upload's size, the broker holds a few
interchangeable messages (never one per document), every queued document says where it stands, a workspace at its
limit waits its turn out, and short jobs go to a line of their own with a place and a limit. The picks, the
documents, the leases and Redis are real; messages go to the tests' unread queue (tests/conftest.py)."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.services import Actor
from cluster import queues
from rag_studio import services
from rag_studio.models import Document, DocumentStatus
from rag_studio.pipeline import ingestion, line
from tests.conftest import UNREAD_QUEUE
from tests.rag_studio.conftest import upload

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_turns():
    """The line's memory of whose turn it was, the pace measured by earlier tests, and the unread queue: empty for
    each test."""
    queues.broker().delete(line.SERVED, UNREAD_QUEUE)
    queues.broker().hdel(queues.DURATIONS, line.DOCUMENT_SECONDS)
    yield
    queues.broker().delete(line.SERVED, UNREAD_QUEUE)


@pytest.fixture
def sent(monkeypatch):
    """The line's messages, as they wait in Redis: the tests' messages go to the unread queue (tests/conftest.py),
    so that queue stands for the ingest queue here."""
    monkeypatch.setattr(queues, "INGEST", UNREAD_QUEUE)
    return lambda: [message.task for message in queues.waiting(UNREAD_QUEUE)]


def _files(prefix: str, count: int) -> list:
    return [upload(f"{prefix}-{n}.txt", f"{prefix} note {n}: the pump on line {n} was serviced.".encode())
            for n in range(count)]


@pytest.fixture
def two_teams(make_workspace, presets, sent):
    acme = make_workspace("Acme", owner="ann")
    globex = make_workspace("Globex", owner="bob")
    ann, bob = (Actor(user=w.memberships.get(role="owner").user) for w in (acme, globex))
    manuals = services.create_knowledge_base(actor=ann, workspace=acme, name="Manuals")
    services.upload_documents(actor=ann, kb=manuals, uploads=_files("manual", 12))
    notes = services.create_knowledge_base(actor=bob, workspace=globex, name="Notes")
    first, = services.upload_documents(actor=bob, kb=notes, uploads=_files("note", 1))
    return {"acme": acme, "globex": globex, "ann": ann, "bob": bob, "manuals": manuals, "notes": notes,
            "globex_first": first.document}


def _serve(pick: line.Pick) -> None:
    """What a worker does with a pick, short of ingesting: take the group's documents off the line."""
    line.mark_served(pick)
    group = Document.objects.filter(knowledge_base_id=pick.knowledge_base_id,
                                    status=DocumentStatus.QUEUED).order_by("pk")[:pick.group]
    Document.objects.filter(pk__in=[d.pk for d in group]).update(status=DocumentStatus.INDEXED)


def test_workspaces_take_turns_whatever_their_uploads_size(two_teams):
    first = line.next_pick()
    # Acme uploaded first; while Globex waits, Acme's group is a small one.
    assert first.workspace_id == two_teams["acme"].pk and first.group == 4
    _serve(first)
    second = line.next_pick()
    assert (second.workspace_id, second.document_id) == (two_teams["globex"].pk, two_teams["globex_first"].pk)
    _serve(second)
    alone = line.next_pick()
    assert alone.workspace_id == two_teams["acme"].pk and alone.group == 32  # alone again: full groups


def test_a_workspaces_knowledge_bases_take_turns_and_a_stalled_document_goes_first(two_teams):
    ann, acme = two_teams["ann"], two_teams["acme"]
    faq = services.create_knowledge_base(actor=ann, workspace=acme, name="FAQ")
    services.upload_documents(actor=ann, kb=faq, uploads=_files("faq", 2))
    picks = []
    for _turn in range(4):
        pick = line.next_pick()
        picks.append((pick.workspace_id, pick.knowledge_base_id))
        _serve(pick)
    assert picks == [(acme.pk, two_teams["manuals"].pk), (two_teams["globex"].pk, two_teams["notes"].pk),
                     (acme.pk, faq.pk), (acme.pk, two_teams["manuals"].pk)]

    # A worker died holding one of them: it goes first, alone.
    stalled = Document.objects.filter(knowledge_base=two_teams["manuals"]).order_by("pk").last()
    Document.objects.filter(pk=stalled.pk).update(status=DocumentStatus.PROCESSING, lease_owner="worker@x/1/t",
                                                  lease_until=timezone.now())
    assert (line.next_pick().document_id, line.next_pick().group) == (stalled.pk, 1)


def test_the_broker_holds_at_most_a_message_per_worker_slot_however_many_documents_wait(two_teams, sent,
                                                                                        settings):
    settings.RAG_INGEST_SLOTS = 2
    assert Document.objects.filter(status=DocumentStatus.QUEUED).count() == 13
    # Thirteen documents waiting and two sweeps: two messages wait in the broker, none per document.
    assert ingestion.resume_stalled() == [] and ingestion.resume_stalled() == []
    assert sent() == [line.NEXT_TASK] * 2
    queues.broker().delete(UNREAD_QUEUE)  # the workers took them, and ingested everything
    Document.objects.update(status=DocumentStatus.INDEXED)
    assert line.pump() == 0 and sent() == []


def test_every_queued_document_says_where_it_stands_and_never_whose_work_is_ahead(two_teams, key_client,
                                                                                 settings):
    settings.RAG_INGEST_SLOTS = 2
    globex = key_client("bob", two_teams["globex"])
    [mine] = globex.get(f"/api/rag/knowledge-bases/{two_teams['notes'].pk}/documents/").json()
    # One turn of Acme's comes first, then this document: second in line, though twelve of Acme's were queued.
    assert mine["queue"]["position"] == 2 and mine["queue"]["ahead_in_your_workspace"] == 0
    # One document ahead, two slots, no pace measured yet (5 s a document).
    assert mine["queue"]["reason"] == "waiting for the ingestion workers" and mine["queue"]["estimated_start_s"] == 2.5
    acme = key_client("ann", two_teams["acme"]).get("/api/rag/documents/").json()["results"]
    last = max(acme, key=lambda d: d["id"])
    assert last["queue"]["ahead_in_your_workspace"] == 11 and last["queue"]["position"] == 13
    assert "Globex" not in str(acme) and "note-0" not in str(acme)

    page = key_client("bob", two_teams["globex"])
    gui = Client()
    gui.login(username="bob", password="correct-horse-battery")
    assert "#2 in line" in gui.get(f"/rag/kb/{two_teams['notes'].pk}/").content.decode()
    Document.objects.filter(knowledge_base=two_teams["notes"]).update(status=DocumentStatus.INDEXED)
    assert page.get(f"/api/rag/documents/{mine['id']}/").json()["queue"] is None


def test_a_workspace_at_its_limit_of_documents_in_flight_waits_its_turn_out_and_says_so(two_teams, key_client,
                                                                                       settings):
    settings.RAG_WORKSPACE_MAX_IN_FLIGHT = 1
    busy = Document.objects.filter(knowledge_base=two_teams["manuals"]).order_by("pk").first()
    Document.objects.filter(pk=busy.pk).update(status=DocumentStatus.PROCESSING, lease_owner="worker@x/1/t",
                                               lease_until=timezone.now() + timedelta(seconds=60))
    assert line.next_pick().workspace_id == two_teams["globex"].pk
    Document.objects.filter(knowledge_base=two_teams["notes"]).update(status=DocumentStatus.INDEXED)
    assert line.next_pick() is None  # Acme's documents wait for its one in flight
    waiting = key_client("ann", two_teams["acme"]).get("/api/rag/documents/").json()["results"]
    queued = [d for d in waiting if d["status"] == "queued"]
    assert queued and all("limit of 1 documents in flight" in d["queue"]["reason"] for d in queued)


def test_the_line_is_the_database_redis_loses_only_whose_turn_it_was(two_teams):
    _serve(line.next_pick())
    queues.broker().delete(line.SERVED)  # a Redis restart
    assert line.next_pick().workspace_id == two_teams["acme"].pk  # turns start afresh, oldest first
    services.delete_knowledge_base(actor=two_teams["ann"], kb=two_teams["manuals"])
    # Eleven queued documents left the line with their knowledge base, at once.
    assert line.next_pick().workspace_id == two_teams["globex"].pk
    assert line.ready().count() == 1


def test_a_line_message_ingests_the_next_group_in_fair_order(two_teams, settings):
    settings.RAG_INGEST_SHARED_GROUP_DOCS = 3
    assert ingestion.ingest_next("worker@n/1/t1") == DocumentStatus.INDEXED
    assert Document.objects.filter(knowledge_base=two_teams["manuals"], status=DocumentStatus.INDEXED).count() == 3
    assert ingestion.ingest_next("worker@n/1/t2") == DocumentStatus.INDEXED
    assert Document.objects.get(pk=two_teams["globex_first"].pk).status == DocumentStatus.INDEXED
    assert queues.typical_seconds(line.DOCUMENT_SECONDS, 0.0) > 0


def test_a_turn_in_the_line_is_sized_by_time_so_another_workspaces_document_starts_next(two_teams, settings):
    """Issue 49: a worker holding a group of a bulk upload hands the rest back once its turn's time is up while
    someone else's document waits, finishing the document in hand; alone, it keeps its whole group."""
    settings.RAG_INGEST_TURN_S, settings.RAG_INGEST_SHARED_GROUP_DOCS = 0, 6
    manuals = Document.objects.filter(knowledge_base=two_teams["manuals"]).order_by("pk")
    first = manuals.first()
    assert ingestion.ingest_next("worker@n/1/t1") == DocumentStatus.INDEXED
    assert list(manuals.values_list("status", flat=True)) == [DocumentStatus.INDEXED] + [DocumentStatus.QUEUED] * 11
    # Handed back untouched: the claim was not an attempt, and nothing says it started.
    assert set(manuals.exclude(pk=first.pk).values_list("attempts", "lease_owner")) == {(0, "")}
    assert line.next_pick().workspace_id == two_teams["globex"].pk

    services.delete_knowledge_base(actor=two_teams["bob"], kb=two_teams["notes"])
    second = manuals.filter(status=DocumentStatus.QUEUED).first()
    assert ingestion.ingest(second.pk, "worker@n/1/t2", group=6) == DocumentStatus.INDEXED
    assert manuals.filter(status=DocumentStatus.INDEXED).count() == 7


def test_a_turn_that_ends_while_embedding_hands_back_the_documents_not_started_at_their_stage(
        two_teams, settings, monkeypatch):
    settings.RAG_INGEST_TURN_S = 0
    settings.RAG_EMBED_BATCH_SIZE = 1
    monkeypatch.setattr(ingestion, "EMBED_CALL_BATCHES", 1)  # a model call per document: the turn is checked between
    waiting = Document.objects.filter(pk=two_teams["globex_first"].pk)
    waiting.update(status=DocumentStatus.PROCESSING, lease_owner="elsewhere",
                   lease_until=timezone.now() + timedelta(minutes=5))
    embed = ingestion.GROUP_STAGES[ingestion.Stage.EMBED]

    def embed_once_globex_waits(documents, worker, **options):
        waiting.update(status=DocumentStatus.QUEUED, lease_owner="", lease_until=None)  # its upload arrives now
        embed(documents, worker, **options)

    monkeypatch.setitem(ingestion.GROUP_STAGES, ingestion.Stage.EMBED, embed_once_globex_waits)
    manuals = Document.objects.filter(knowledge_base=two_teams["manuals"]).order_by("pk")
    settings.RAG_INGEST_GROUP_DOCS = 4
    assert ingestion.ingest_next("worker@n/1/t1") == DocumentStatus.INDEXED
    rows = list(manuals.values_list("status", "stage"))
    assert rows[:4] == [(DocumentStatus.INDEXED, ingestion.Stage.DONE)] + [
        (DocumentStatus.QUEUED, ingestion.Stage.EMBED)] * 3
    handed_back = manuals[1]
    assert handed_back.events.filter(message__contains="turn ended").exists()
    # Its turn comes again after Globex's: it goes on from its chunks, and nothing is indexed twice.
    assert line.next_pick().workspace_id == two_teams["globex"].pk
    monkeypatch.setitem(ingestion.GROUP_STAGES, ingestion.Stage.EMBED, embed)
    assert ingestion.ingest(handed_back.pk, "worker@n/1/t2", group=1) == DocumentStatus.INDEXED
    assert Document.objects.get(pk=handed_back.pk).chunk_count == handed_back.chunk_count


def test_a_new_knowledge_bases_document_waits_one_turn_not_behind_the_whole_upload_and_the_poll_follows_it(
        two_teams, settings):
    """Issue 48: a 1 KB file in a new knowledge base said "#44 in line · 43 of yours ahead" behind the workspace's
    bulk upload to another one, though the knowledge bases take turns; and the figures the page polls did not move
    while the documents ahead were being ingested."""
    settings.RAG_INGEST_SLOTS = 2
    ann, acme = two_teams["ann"], two_teams["acme"]
    faq = services.create_knowledge_base(actor=ann, workspace=acme, name="FAQ")
    services.upload_documents(actor=ann, kb=faq, uploads=_files("faq", 1))
    gui = Client()
    gui.login(username="ann", password="correct-horse-battery")

    def place() -> dict:
        [document] = gui.get(f"/rag/kb/{faq.pk}/progress/").json()["documents"]
        return document["queue"]

    # One turn of Manuals (twelve queued) and one of Globex come first: third, not fourteenth.
    assert (place()["position"], place()["ahead_in_your_workspace"]) == (3, 1)
    assert place()["estimated_start_s"] == 5.0  # two documents ahead, two slots, 5 s a document
    # Four Manuals documents go in flight: the wait grows by what is left of them, and shrinks as their stages end.
    taken = Document.objects.filter(knowledge_base=two_teams["manuals"]).order_by("pk")[:4]
    Document.objects.filter(pk__in=[d.pk for d in taken]).update(
        status=DocumentStatus.PROCESSING, lease_owner="worker@x/1/t", lease_until=timezone.now() + timedelta(hours=1))
    assert place()["estimated_start_s"] == 15.0
    Document.objects.filter(pk__in=[d.pk for d in taken]).update(progress=50)
    assert place()["estimated_start_s"] == 10.0
    # They are indexed, and so is Globex's: the FAQ's document is next after Manuals' turn.
    Document.objects.filter(pk__in=[d.pk for d in taken]).update(status=DocumentStatus.INDEXED, progress=100)
    Document.objects.filter(knowledge_base=two_teams["notes"]).update(status=DocumentStatus.INDEXED)
    assert (place()["position"], place()["estimated_start_s"]) == (2, 2.5)
