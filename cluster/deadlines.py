"""Node jobs past their deadline: beat finds every queued or running job that nothing is working on and sends it
again, or fails it with the reason.

- A job **queued** on a healthy node whose message was sent CLUSTER_JOB_QUEUED_DEADLINE_S ago and not taken lost
  its message (a Redis restart, a purge): it is sent again.
- A job **running** whose worker stopped its heartbeat died with it (kill -9, a lost machine): it is run again, as
  `jobs.py` requires every handler to allow.
- After CLUSTER_JOB_MAX_DISPATCHES sends, or when its node is unhealthy, the job fails with the reason, and
  `job_given_up` tells the app that dispatched it (serving marks the replica failed, rather than "starting" for
  ever).

The heartbeat lives in the cache (Redis), not in the job's row: a key per running job, refreshed by a thread of the
task every CLUSTER_JOB_HEARTBEAT_S and expiring after three beats. Every write to the database would contend with
ingestion on SQLite. A key lost with a Redis restart is only suspected at first; the job is called dead when it is
still missing a full heartbeat timeout later, by which time a live worker has written it again. The same key keeps
a job from running twice: a second message for a job that is running elsewhere is dropped.
"""

import logging
import math
import threading
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connections
from django.dispatch import Signal
from django.utils import timezone

from cluster import log_messages as log, queues
from cluster.models import Job, JobEvent, JobState, NodeStatus, Workload, WorkloadState

logger = logging.getLogger(__name__)
RUN_JOB_TASK = "cluster.tasks.run_job"
# How log.DISPATCHED_AGAIN begins: the events a job's dispatches are counted by.
REDISPATCHED = "Dispatched again"
# Sent with `job` and `reason` when a job is failed here, to the app that dispatched it.
job_given_up = Signal()


# The heartbeat's value once the run has handed the job back (hand_over), with a token of its own: free for the next
# run to claim, once.
HANDED_OVER = "handed-over:"


def _alive_key(job_id: int) -> str:
    return f"cluster:job:{job_id}:alive"


def _suspect_key(job_id: int) -> str:
    return f"cluster:job:{job_id}:suspect"


def _heartbeat_timeout_s() -> int:
    return math.ceil(3 * settings.CLUSTER_JOB_HEARTBEAT_S)  # Redis expires keys in whole seconds


class JobHeartbeat:
    """While the block runs, a thread says in the cache that `owner` is running the job. `claim()` first: False
    when another live worker is running it (a second message for the same job)."""

    def __init__(self, job_id: int, owner: str):
        self._job_id, self._owner = job_id, owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"job-{job_id}-heartbeat", daemon=True)

    def claim(self) -> bool:
        key = _alive_key(self._job_id)
        try:
            if cache.add(key, self._owner, timeout=_heartbeat_timeout_s()):
                return True
            holder = cache.get(key)
            if isinstance(holder, str) and holder.startswith(HANDED_OVER):
                # A job handed over may get more than one message (the restart, a redispatch): the one that takes
                # this hand-over's token, atomically, runs it.
                if not cache.add(f"{key}:{holder}", self._owner, timeout=_heartbeat_timeout_s()):
                    return False
                cache.set(key, self._owner, timeout=_heartbeat_timeout_s())
                return True
            return holder == self._owner
        except Exception as exc:  # without Redis nothing can run twice: no second message can arrive either
            logger.warning("Could not claim job %s's heartbeat: %s", self._job_id, exc)
            return True

    def __enter__(self) -> "JobHeartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        try:
            if cache.get(_alive_key(self._job_id)) == self._owner:  # not once handed over
                cache.delete(_alive_key(self._job_id))
        except Exception as exc:  # the cache is Redis; a missing key just expires
            logger.warning("Could not clear job %s's heartbeat: %s", self._job_id, exc)

    def _write(self) -> None:
        try:
            if cache.get(_alive_key(self._job_id)) in (None, self._owner):  # not once handed over
                cache.set(_alive_key(self._job_id), self._owner, timeout=_heartbeat_timeout_s())
        except Exception as exc:  # Redis away for a moment: the next beat writes it again
            logger.warning("Could not write job %s's heartbeat: %s", self._job_id, exc)

    def _beat(self) -> None:
        try:
            while not self._stop.wait(settings.CLUSTER_JOB_HEARTBEAT_S):
                self._write()
        finally:
            connections.close_all()


def hand_over(job_id: int) -> None:
    """The job's run is ending by handing it back to the pool: the next message for it (a restart on a new size,
    or its admission) may be taken by another worker at once, before this run's heartbeat block has ended, and
    claims the job rather than finding it running elsewhere."""
    try:
        cache.set(_alive_key(job_id), HANDED_OVER + uuid.uuid4().hex, timeout=_heartbeat_timeout_s())
    except Exception as exc:  # the cache is Redis; without it no claim is checked either
        logger.warning("Could not hand job %s over: %s", job_id, exc)


def _worker_dead(job: Job) -> bool:
    """True when the job's heartbeat has been missing for a full timeout (checked across two sweeps)."""
    if cache.get(_alive_key(job.pk)) is not None:
        cache.delete(_suspect_key(job.pk))
        return False
    if job.started_at and timezone.now() - job.started_at < timedelta(seconds=_heartbeat_timeout_s()):
        return False
    since = cache.get(_suspect_key(job.pk))
    if since is None:
        cache.set(_suspect_key(job.pk), time.time(), timeout=10 * _heartbeat_timeout_s())
        return False
    return time.time() - since >= _heartbeat_timeout_s()


def _last_dispatch(job: Job):
    event = job.events.filter(message__startswith=REDISPATCHED).order_by("-at").first() or \
        job.events.filter(state=JobState.QUEUED).order_by("-at").first()
    return event.at if event else job.created_at


def _dispatches(job: Job) -> int:
    return 1 + job.events.filter(message__startswith=REDISPATCHED).count()


def waiting_for_devices(job: Job) -> bool:
    return Workload.objects.filter(job=job, state=WorkloadState.WAITING).exists()


def sweep_overdue_jobs() -> dict[str, list[int]]:
    """Beat: send again or fail every queued or running job that nothing is working on."""
    now = timezone.now()
    outcome = {"redispatched": [], "failed": []}
    queued_cutoff = now - timedelta(seconds=settings.CLUSTER_JOB_QUEUED_DEADLINE_S)
    for job in Job.objects.select_related("node").filter(state=JobState.QUEUED, created_at__lt=queued_cutoff):
        if _last_dispatch(job) >= queued_cutoff:
            continue
        if job.node.status == NodeStatus.HEALTHY and waiting_for_devices(job):
            continue  # no message yet: the pool's scheduler sends it when it admits the job
        if job.node.status != NodeStatus.HEALTHY:
            reason = log.NODE_UNHEALTHY_WAITED(node=job.node.name,
                                               seconds=f"{settings.CLUSTER_JOB_QUEUED_DEADLINE_S:.0f}")
        else:
            reason = log.MESSAGE_LOST(seconds=f"{settings.CLUSTER_JOB_QUEUED_DEADLINE_S:.0f}")
        _redispatch_or_fail(job, JobState.QUEUED, reason, outcome, may_redispatch=job.node.status == NodeStatus.HEALTHY)
    for job in Job.objects.select_related("node").filter(state=JobState.RUNNING):
        if not _worker_dead(job):
            continue
        reason = log.WORKER_SILENT(worker=job.worker or "unknown", seconds=_heartbeat_timeout_s())
        _redispatch_or_fail(job, JobState.RUNNING, reason, outcome, may_redispatch=True)
    return outcome


def _redispatch_or_fail(job: Job, state: str, reason: str, outcome: dict, *, may_redispatch: bool) -> None:
    dispatches = _dispatches(job)
    if may_redispatch and dispatches < settings.CLUSTER_JOB_MAX_DISPATCHES:
        JobEvent.objects.create(job=job, state=state, message=log.DISPATCHED_AGAIN(
            count=dispatches + 1, limit=settings.CLUSTER_JOB_MAX_DISPATCHES, reason=reason))
        cache.delete(_suspect_key(job.pk))
        result = queues.send(RUN_JOB_TASK, [job.pk], queue=job.node.queue, workspace_id=job.workspace_id)
        Job.objects.filter(pk=job.pk).update(celery_task_id=result.id)
        outcome["redispatched"].append(job.pk)
        return
    if may_redispatch:
        reason = log.GAVE_UP(reason=reason, count=dispatches)
    if not Job.objects.filter(pk=job.pk, state=state).update(state=JobState.FAILED, error=reason,
                                                           finished_at=timezone.now()):
        return  # it moved on meanwhile
    JobEvent.objects.create(job=job, state=JobState.FAILED, message=reason)
    logger.warning("Job %s (%s) failed: %s", job.pk, job.kind, reason)
    job.refresh_from_db()
    job_given_up.send(sender=Job, job=job, reason=reason)
    outcome["failed"].append(job.pk)
