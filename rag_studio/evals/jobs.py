"""Background evaluation work held by a lease: generating an eval set, an eval run, a retrieval tuning.

Each is a row with `status`, `attempts`, `lease_owner`, `lease_until` and `dispatched_at`, worked on by a Celery
task. A redelivered task message finds the work held and leaves it; beat (`sweep_overdue`) dispatches again the work
whose worker died or whose message was lost, and a claim past RAG_EVAL_MAX_ATTEMPTS fails it with the reason. The
work saves each piece as it completes, so a task that takes over resumes rather than starts again.
"""

import logging
from datetime import timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from cluster import leases, queues
from rag_studio.models import EvalRun, EvalSet, JobStatus, RetrievalTuning

GENERATE_TASK, RUN_TASK, TUNE_TASK = ("rag_studio.tasks.generate_eval_set", "rag_studio.tasks.run_eval",
                                      "rag_studio.tasks.tune_retrieval")
TASKS = ((EvalSet, GENERATE_TASK), (EvalRun, RUN_TASK), (RetrievalTuning, TUNE_TASK))
# Considers an automatic tuning job for a knowledge base that finished indexing (evals/adaptive.py).
ADAPT_TASK = "rag_studio.tasks.adapt_retrieval"
logger = logging.getLogger(__name__)


def active_in(workspace_id: int) -> int:
    """The workspace's eval sets being generated, eval runs and tunings, queued or running (its job limit)."""
    active = {"status__in": [JobStatus.QUEUED, JobStatus.RUNNING]}
    return (EvalSet.objects.filter(workspace_id=workspace_id, **active).count()
            + EvalRun.objects.filter(eval_set__workspace_id=workspace_id, **active).count()
            + RetrievalTuning.objects.filter(workspace_id=workspace_id, automatic=False, **active).count())


def workspace_of(model, pk: int) -> int | None:
    field = "eval_set__workspace_id" if model is EvalRun else "workspace_id"
    return model.objects.filter(pk=pk).values_list(field, flat=True).first()


def queue_of(model, pk: int) -> str:
    """A person waits for all of this work but an automatic tuning job (evals/adaptive.py): that one runs on the
    main workers' `default` queue, in the background, so it never holds the interactive worker from someone's job."""
    if model is RetrievalTuning and RetrievalTuning.objects.filter(pk=pk, automatic=True).exists():
        return queues.DEFAULT
    return queues.INTERACTIVE


def dispatch(model, task: str, pk: int) -> None:
    model.objects.filter(pk=pk).update(dispatched_at=timezone.now())
    queues.send(task, [pk], queue=queue_of(model, pk), workspace_id=workspace_of(model, pk))


def place(line: queues.Line, model, task: str, row) -> queues.Place | None:
    """Where a queued piece of work stands in its line (`line`, the interactive one, read once for a list page);
    None once it runs."""
    if row.status != JobStatus.QUEUED:
        return None
    if getattr(row, "automatic", False):
        return queues.Line(queues.DEFAULT, workers=settings.RAG_INGEST_SLOTS).place(
            task, [row.pk], workspace_id=workspace_of(model, row.pk), default_s=60.0,
            reason=_("waiting for a background worker (an automatic job gives way to ingestion and your own jobs)"))
    return line.place(task, [row.pk], workspace_id=workspace_of(model, row.pk), default_s=60.0,
                      reason=_("waiting for the interactive worker (evaluations, tuning, calibration)"))


def cancel(model, task: str, pk: int) -> bool:
    """Stop queued or running work; False when it had already ended. A queued one leaves the line at once; a running
    one stops before its next piece, its worker finding the lease gone (`still_held`). What was done is kept."""
    if not model.objects.filter(pk=pk, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).update(
            status=JobStatus.CANCELLED, lease_owner="", lease_until=None):
        return False
    queues.withdraw(queue_of(model, pk), task, [pk])
    return True


class Held(Exception):
    """Another worker holds the work now, or a user cancelled it: stop without touching it."""


def claim(model, pk: int, owner: str):
    """Take the work, or None when it is finished, cancelled or held by a live worker. Past RAG_EVAL_MAX_ATTEMPTS
    takeovers it fails with the reason instead."""
    now = timezone.now()
    claimed = model.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner),
        pk=pk, status__in=[JobStatus.QUEUED, JobStatus.RUNNING],
    ).update(status=JobStatus.RUNNING, lease_owner=owner, lease_until=leases.lease_until(settings.RAG_EVAL_LEASE_S),
             attempts=F("attempts") + 1)
    if not claimed:
        return None
    row = model.objects.get(pk=pk)
    if row.attempts > settings.RAG_EVAL_MAX_ATTEMPTS:
        finish(model, pk, owner, status=JobStatus.FAILED,
               error=f"Stopped {row.attempts - 1} times without finishing (its worker died or ran out of time "
                     f"each time); the work done so far is kept.")
        return None
    return row


def finish(model, pk: int, owner: str, **fields) -> bool:
    """Record the outcome, but only while `owner` still holds the work."""
    if fields.get("status") in (JobStatus.DONE, JobStatus.FAILED) and hasattr(model, "finished_at"):
        fields.setdefault("finished_at", timezone.now())
    return bool(model.objects.filter(pk=pk, lease_owner=owner, status=JobStatus.RUNNING).update(
        lease_owner="", lease_until=None, **fields))


def still_held(model, pk: int, owner: str) -> None:
    if not model.objects.filter(pk=pk, lease_owner=owner, status=JobStatus.RUNNING).exists():
        raise Held()


def release(model, pk: int, owner: str) -> None:
    """Let the lease run out now (a time limit stopped the task): beat dispatches it again to resume."""
    model.objects.filter(pk=pk, lease_owner=owner, status=JobStatus.RUNNING).update(lease_until=timezone.now())


def run_held(model, pk: int, owner: str, work, *, failure: str = "") -> str:
    """Claim the work, run `work(row)` while a thread renews the lease, and record the fields it returns (with
    the final `status`). A time limit lets the lease run out so that beat resumes it; work taken over or cancelled
    meanwhile is left alone; an error fails it, `failure` and the error as the reason. Returns the status."""
    row = claim(model, pk, owner)
    if row is None:
        return model.objects.filter(pk=pk).values_list("status", flat=True).first() or "deleted"
    running = model.objects.filter(status=JobStatus.RUNNING, lease_owner=owner)
    with leases.kept(running, lease_s=settings.RAG_EVAL_LEASE_S):
        try:
            outcome = work(row)
        except SoftTimeLimitExceeded:
            release(model, pk, owner)
            return "timed out"
        except Held:
            return "skipped"
        except Exception as exc:
            logger.exception("%s %s failed", model.__name__, pk)
            finish(model, pk, owner, status=JobStatus.FAILED, error=f"{failure}{exc}"[:2000])
            return JobStatus.FAILED
    finish(model, pk, owner, **outcome)
    return outcome["status"]


def sweep_overdue() -> dict[str, list[int]]:
    """Beat: dispatch again every piece of work whose worker stopped renewing its lease, and every queued one whose
    message is really gone: sent RAG_QUEUED_REDISPATCH_S ago (or never) and no longer waiting in the broker. A
    message that is only waiting its turn is left alone, so the line never fills with copies. A claim past the
    attempts fails the work."""
    now = timezone.now()
    overdue = now - timedelta(seconds=settings.RAG_QUEUED_REDISPATCH_S)
    # Queued (or running with no lease at all: left by a version without leases) and sent long ago, or never.
    never_held = Q(status__in=[JobStatus.QUEUED, JobStatus.RUNNING], lease_until__isnull=True)
    stalled = (Q(status=JobStatus.RUNNING, lease_until__lt=now)
               | never_held & Q(dispatched_at__lt=overdue)
               | never_held & Q(dispatched_at__isnull=True, created_at__lt=overdue))
    waiting = {(message.task, message.args) for queue in (queues.INTERACTIVE, queues.DEFAULT)
               for message in queues.waiting(queue)}
    swept = {}
    for model, task in TASKS:
        candidates = model.objects.filter(stalled).order_by("pk").values_list("pk", flat=True)
        swept[task] = [pk for pk in candidates if (task, (pk,)) not in waiting]
        for pk in swept[task]:
            dispatch(model, task, pk)
    return swept
