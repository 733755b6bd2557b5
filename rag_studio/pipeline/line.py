"""The ingestion line: which document a free ingestion worker takes next, fairly, and where a queued one stands.

An upload sends no broker message per document: a 1,000-document upload would put 1,000 messages ahead of another
workspace's first document. The database is the line: documents queued, or held by a worker that stopped renewing
its lease. The broker holds a few interchangeable messages (`rag_studio.tasks.ingest_next`), never more than the
ingestion workers' slots (RAG_INGEST_SLOTS): a worker that takes one ingests the next group in fair order, then
tops the messages up again (`pump`). A lost message costs nothing but a sweep's wait: beat pumps while documents
are ready.

Fair order: a document whose worker died goes first (its work is half done); then workspaces take turns, the one
served longest ago first, and within a workspace its knowledge bases take turns; then the oldest document. A
workspace at its limit of documents in flight (RAG_WORKSPACE_MAX_IN_FLIGHT) waits its turn out. Redis remembers when
each workspace and knowledge base was last served; lost with a Redis restart, the turns start afresh, and nothing
else is lost. While other workspaces wait, a group holds few documents (RAG_INGEST_SHARED_GROUP_DOCS), so nobody's
first document waits behind a long group; alone, a workspace's groups are full (RAG_INGEST_GROUP_DOCS).
"""

import bisect
import time
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from cluster import queues
from rag_studio.models import Document, DocumentStatus

NEXT_TASK = "rag_studio.tasks.ingest_next"
SERVED = "ingest:served"
# A document's ingestion time before any has been measured on this platform.
DEFAULT_DOCUMENT_S = 5.0
DOCUMENT_SECONDS = "ingest:document"


def ready() -> QuerySet[Document]:
    """Documents a worker may take now: queued, or held by a worker whose lease ran out."""
    return Document.objects.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=timezone.now()),
                                   status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING])


def in_flight() -> QuerySet[Document]:
    return Document.objects.filter(status=DocumentStatus.PROCESSING, lease_until__gte=timezone.now())


def takeable() -> QuerySet[Document]:
    """Ready documents whose workspace is not at its limit of documents in flight."""
    return ready().exclude(knowledge_base__workspace_id__in=_workspaces_at_limit())


def _workspaces_at_limit() -> set[int]:
    limit = settings.RAG_WORKSPACE_MAX_IN_FLIGHT
    if not limit:
        return set()
    counts = in_flight().values("knowledge_base__workspace_id").annotate(n=Count("pk"))
    return {row["knowledge_base__workspace_id"] for row in counts if row["n"] >= limit}


@dataclass(frozen=True)
class Pick:
    document_id: int
    knowledge_base_id: int
    workspace_id: int
    # Documents the worker may take along from the same knowledge base.
    group: int


def _served() -> dict[str, float]:
    return {key.decode(): float(value) for key, value in queues.broker().hgetall(SERVED).items()}


def next_pick() -> Pick | None:
    """The next document in fair order, or None when no document is ready (or every ready one's workspace is at
    its limit)."""
    resumable = ready().filter(status=DocumentStatus.PROCESSING).select_related("knowledge_base").order_by("pk").first()
    if resumable is not None:
        return Pick(resumable.pk, resumable.knowledge_base_id, resumable.knowledge_base.workspace_id, group=1)
    heads = list(takeable().values("knowledge_base__workspace_id", "knowledge_base_id").annotate(first=Min("pk")))
    if not heads:
        return None
    served = _served()
    workspaces = {head["knowledge_base__workspace_id"] for head in heads}
    workspace = min(workspaces, key=lambda w: (served.get(f"w:{w}", 0.0), min(
        head["first"] for head in heads if head["knowledge_base__workspace_id"] == w)))
    head = min((head for head in heads if head["knowledge_base__workspace_id"] == workspace),
               key=lambda head: (served.get(f"kb:{head['knowledge_base_id']}", 0.0), head["first"]))
    shared = len(workspaces) > 1
    return Pick(head["first"], head["knowledge_base_id"], workspace,
                group=settings.RAG_INGEST_SHARED_GROUP_DOCS if shared else settings.RAG_INGEST_GROUP_DOCS)


def others_waiting(workspace_id: int) -> bool:
    """Another workspace has a document a worker could take now."""
    return takeable().exclude(knowledge_base__workspace_id=workspace_id).exists()


class Turn:
    """A worker's turn in the line is about RAG_INGEST_TURN_S of work, not a count of documents: past it, while
    another workspace's documents wait, the worker finishes the documents in hand and hands the rest of its group
    back, so a small document from someone else starts within seconds of a slot, however slow the box or large the
    bulk upload ahead of it."""

    def __init__(self, workspace_id: int):
        self.workspace_id = workspace_id
        self.ends = time.monotonic() + settings.RAG_INGEST_TURN_S

    def over(self) -> bool:
        return time.monotonic() >= self.ends and others_waiting(self.workspace_id)


def mark_served(pick: Pick) -> None:
    now = time.time()
    queues.broker().hset(SERVED, mapping={f"w:{pick.workspace_id}": now, f"kb:{pick.knowledge_base_id}": now})


def pump() -> int:
    """Top the broker's ingestion messages up to the workers' slots while documents are ready; how many were sent.
    Never more than the slots wait, so the queue holds no build-up whatever the number of documents."""
    missing = min(settings.RAG_INGEST_SLOTS, takeable().count()) - queues.length(queues.INGEST)
    for _sent in range(max(missing, 0)):
        queues.send(NEXT_TASK, [], queue=queues.INGEST, workspace_id=None)
    return max(missing, 0)


def record_document_seconds(seconds_each: float) -> None:
    queues.record_duration(DOCUMENT_SECONDS, seconds_each)


class Snapshot:
    """The line as it stands now, read once (a few queries) however many documents' places are asked of it: a
    list page or the GUI's poll asks for every queued document's."""

    def __init__(self):
        waiting = ready().filter(status=DocumentStatus.QUEUED).values_list(
            "knowledge_base__workspace_id", "knowledge_base_id", "pk")
        # Per workspace, per knowledge base, its queued documents, oldest first.
        self._queued: dict[int, dict[int, list[int]]] = {}
        for workspace_id, kb_id, pk in waiting.order_by("pk"):
            self._queued.setdefault(workspace_id, {}).setdefault(kb_id, []).append(pk)
        self._resumable = ready().filter(status=DocumentStatus.PROCESSING).count()
        # A slot frees only when its whole group is done: what is left of the documents in flight comes before
        # any waiting one, and shrinks as their stages finish, so the estimate counts down while they run.
        self._in_flight = sum(100 - progress for progress in in_flight().values_list("progress", flat=True)) / 100
        self._at_limit = _workspaces_at_limit()
        self._slots = max(settings.RAG_INGEST_SLOTS, 1)
        self._seconds = queues.typical_seconds(DOCUMENT_SECONDS, DEFAULT_DOCUMENT_S)

    def place(self, document_id: int, workspace_id: int) -> queues.Place | None:
        """Where a queued document stands: roughly the ready documents fair order takes before it (the documents
        resumed first; in its workspace, its knowledge base's older ones and a turn of each of the workspace's
        other knowledge bases for each; then a turn of every other waiting workspace for each document of its own
        ahead), and when it may start at the pace measured lately. None for a document not waiting."""
        kbs = self._queued.get(workspace_id, {})
        for kb_id, pks in kbs.items():
            index = bisect.bisect_left(pks, document_id)
            if index < len(pks) and pks[index] == document_id:
                break
        else:
            return None
        own = index + sum(min(len(others), index + 1) for other, others in kbs.items() if other != kb_id)
        others = sum(min(sum(map(len, other_kbs.values())), own + 1)
                     for other, other_kbs in self._queued.items() if other != workspace_id)
        ahead = self._resumable + own + others
        limit = settings.RAG_WORKSPACE_MAX_IN_FLIGHT
        reason = (_("your workspace's limit of %(limit)s documents in flight is reached") % {"limit": limit}
                  if workspace_id in self._at_limit else _("waiting for the ingestion workers"))
        seconds = (ahead + self._in_flight) / self._slots * self._seconds
        return queues.Place(position=ahead + 1, ahead_in_your_workspace=own, estimated_start_s=round(seconds, 1),
                            reason=reason)
