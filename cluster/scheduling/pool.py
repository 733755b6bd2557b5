"""The pool's scheduling pass on the database: reads the pool (healthy nodes' devices by kind, the quotas, every
unfinished workload), asks the policy (policy.py) and applies its decisions:
- admitted: the job's message is sent to its node's queue, as every node job is (cluster/services.py);
- stop or resize: the workload is `stopping`; the job's worker tells its process, which checkpoints at the next
  step boundary and exits, and the worker hands the job back (`Preempted`) to be requeued or restarted on its new
  size; past the grace period the worker stops the process;
- waiting: the reason is stored on the workload, shown on the Pool page and in the API.
A pass runs when a job asks for devices, when one ends or hands its devices back, and on beat's tick
(FACTORY_POOL_INTERVAL_S). One pass at a time (a Redis lock): two passes would admit into the same devices.

Device kinds: a GPU is "<its name> <memory> GiB"; a node without GPUs offers FACTORY_POOL_CPU_SLOTS CPU slots
(default: one per core) of kind `cpu-slot`, so the same machinery runs on CPU boxes.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cluster import log_messages as log, queues
from cluster.deadlines import RUN_JOB_TASK, hand_over
from cluster.models import (
    FINISHED_JOB_STATES,
    DeviceQuota,
    Job,
    JobEvent,
    JobState,
    Node,
    NodeStatus,
    Workload,
    WorkloadState,
)
from cluster.scheduling import policy

logger = logging.getLogger(__name__)
CPU_SLOT = "cpu-slot"
LOCK = "cluster:pool:schedule"
GIB = 1024**3


class Preempted(Exception):
    """Raised by a job's handler when its process stopped at a checkpoint because the pool asked it to: the job is
    requeued (or restarted on its new size), not finished."""


@dataclass(frozen=True)
class DeviceRequest:
    """What a job asks of the pool: `min_devices`..`max_devices` of `device_kind` (all of min at once), on one node
    unless `spread`, on `nodes` only when given."""

    device_kind: str
    min_devices: int = 1
    max_devices: int = 1
    priority: str = policy.PRIORITY_CLASSES[1]
    spread: bool = False
    nodes: tuple[str, ...] = ()
    sizes: tuple[int, ...] = field(default_factory=tuple)


def gpu_kind(name: str, memory_bytes: int) -> str:
    return f"{name} {round(memory_bytes / GIB)} GiB"


def cpu_slots(node: Node) -> int:
    return settings.POOL_CPU_SLOTS or max(1, node.cpu_cores)


def node_kinds(node: Node) -> dict[str, int]:
    """The devices a node offers the pool, by kind."""
    kinds: dict[str, int] = {}
    for device in node.devices.all():
        kind = gpu_kind(device.name, device.memory_bytes)
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds or {CPU_SLOT: cpu_slots(node)}


def capacity() -> dict[str, dict[str, int]]:
    nodes = Node.objects.filter(status=NodeStatus.HEALTHY).prefetch_related("devices")
    return {node.name: node_kinds(node) for node in nodes}


def node_kind(node: Node) -> str:
    """The kind a job on this node trains on: its GPUs' (the first kind, on a mixed node), else CPU slots."""
    return next(iter(node_kinds(node)))


def policy_settings() -> policy.Settings:
    return policy.Settings(interval_s=settings.POOL_INTERVAL_S, min_run_s=settings.POOL_MIN_RUN_S,
                           grace_s=settings.POOL_GRACE_S, aging_s=settings.POOL_AGING_S,
                           starving_s=settings.POOL_STARVING_S, promote_s=settings.POOL_PROMOTE_S)


def quotas() -> dict:
    table: dict = {}
    for quota in DeviceQuota.objects.all():
        table.setdefault(quota.workspace_id, {})[quota.device_kind] = policy.Quota(
            nominal=quota.nominal, borrowing_limit=quota.borrowing_limit, lending_limit=quota.lending_limit)
    return table


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment else None


def as_policy(workload: Workload) -> policy.Workload:
    return policy.Workload(
        id=workload.job_id, workspace=workload.job.workspace_id, kind=workload.device_kind,
        min_devices=workload.min_devices, max_devices=workload.max_devices, priority=workload.priority,
        submitted_at=workload.submitted_at.timestamp(), spread=workload.spread, nodes=tuple(workload.nodes),
        sizes=tuple(workload.sizes),
        allocation=dict(workload.allocation) if workload.state != WorkloadState.WAITING else {},
        started_at=_epoch(workload.started_at), last_checkpoint_at=_epoch(workload.last_checkpoint_at),
        stopping_since=_epoch(workload.stop_requested_at) if workload.state == WorkloadState.STOPPING else None,
        stopping_to=dict(workload.stop_keep), stopping_for=workload.stopped_for_id,
        preemptions=workload.preemptions, nominated=tuple(workload.nominated))


def create_workload(job: Job, request: DeviceRequest) -> Workload:
    workload = Workload.objects.create(
        job=job, device_kind=request.device_kind, min_devices=request.min_devices,
        max_devices=request.max_devices, sizes=list(request.sizes), spread=request.spread,
        nodes=list(request.nodes), priority=request.priority)
    transaction.on_commit(schedule_now)
    return workload


def live_workloads():
    return Workload.objects.exclude(state=WorkloadState.FINISHED).select_related("job", "job__node")


def schedule_now() -> policy.Decisions | None:
    """Run a pass now, unless one is running (it sees this pass's news, or the next tick does)."""
    lock = queues.broker().lock(LOCK, timeout=60, blocking_timeout=10)
    if not lock.acquire():
        return None
    try:
        return _schedule(timezone.now())
    finally:
        try:
            lock.release()
        except Exception:  # expired under a very long pass: the next one runs anyway
            logger.warning("The pool's scheduling lock expired during a pass")


def _schedule(now: datetime) -> policy.Decisions:
    _settle_finished(now)
    rows = {workload.job_id: workload for workload in live_workloads()}  # the policy knows them by job
    decisions = policy.schedule(capacity=capacity(), quotas=quotas(),
                                workloads=[as_policy(workload) for workload in rows.values()],
                                now=now.timestamp(), settings=policy_settings())
    for workload in rows.values():
        _account(workload, now)
    for admit in decisions.admit:
        _admit(rows[admit.workload], admit.allocation, now)
    for stop in decisions.stop:
        _stop(rows[stop.workload], keep=stop.keep, by=rows[stop.by], now=now)
    for grow in decisions.grow:
        _grow(rows[grow.workload], grow.allocation, now)
    for job_id in decisions.kill:
        Workload.objects.filter(job_id=job_id).update(kill_requested=True)
    for job_id, nodes in decisions.nominate.items():
        Workload.objects.filter(job_id=job_id).update(nominated=list(nodes))
    for job_id, reason in decisions.reasons.items():
        if rows[job_id].reason != reason:
            Workload.objects.filter(job_id=job_id).update(reason=reason)
    return decisions


def _settle_finished(now: datetime) -> None:
    for workload in live_workloads().filter(job__state__in=FINISHED_JOB_STATES):
        _account(workload, now)
        Workload.objects.filter(pk=workload.pk).update(state=WorkloadState.FINISHED, allocation={}, reason="",
                                                       nominated=[])


def _account(workload: Workload, now: datetime) -> None:
    """Add the device-seconds held since the last account (the usage per workspace)."""
    held = workload.devices if workload.state != WorkloadState.WAITING else 0
    since = workload.accounted_at or workload.started_at
    if held and since:
        workload.device_seconds += held * max(0.0, (now - since).total_seconds())
    workload.accounted_at = now
    Workload.objects.filter(pk=workload.pk).update(device_seconds=workload.device_seconds, accounted_at=now)


def _describe(allocation: dict[str, int], kind: str) -> str:
    return ", ".join(f"{count} {kind} on {node}" for node, count in allocation.items())


def _admit(workload: Workload, allocation: dict[str, int], now: datetime) -> None:
    job = workload.job
    node = Node.objects.get(name=next(iter(allocation)))
    with transaction.atomic():
        Workload.objects.filter(pk=workload.pk).update(
            state=WorkloadState.RUNNING, allocation=allocation, started_at=now, accounted_at=now, reason="",
            nominated=[], stop_keep={}, stop_requested_at=None, stopped_for=None, kill_requested=False)
        Job.objects.filter(pk=job.pk).update(node=node)
        JobEvent.objects.create(job=job, state=JobState.QUEUED,
                                message=log.ADMITTED(devices=_describe(allocation, workload.device_kind)))
        transaction.on_commit(lambda: _send(job.pk, node, job.workspace_id))


def _send(job_id: int, node: Node, workspace_id: int | None) -> None:
    result = queues.send(RUN_JOB_TASK, [job_id], queue=node.queue, workspace_id=workspace_id)
    Job.objects.filter(pk=job_id).update(celery_task_id=result.id)


def _stop(workload: Workload, *, keep: dict[str, int], by: Workload, now: datetime) -> None:
    Workload.objects.filter(pk=workload.pk).update(
        state=WorkloadState.STOPPING, stop_requested_at=now, stop_keep=keep, stopped_for=by.job)
    message = log.SHRINKING(job=by.job_id, priority=by.priority, devices=sum(keep.values())) if keep else \
        log.PREEMPTED(job=by.job_id, priority=by.priority)
    JobEvent.objects.create(job=workload.job, state=workload.job.state, message=message)


def _grow(workload: Workload, allocation: dict[str, int], now: datetime) -> None:
    Workload.objects.filter(pk=workload.pk).update(
        state=WorkloadState.STOPPING, stop_requested_at=now, stop_keep=allocation, allocation=allocation,
        stopped_for=None)
    JobEvent.objects.create(job=workload.job, state=workload.job.state,
                            message=log.GROWING(devices=sum(allocation.values())))


def stop_instruction(job_id: int) -> str:
    """What the job's worker should do with its process now: "" (go on), "stop" (checkpoint at the next step
    boundary and exit) or "kill" (the grace period is over)."""
    workload = Workload.objects.filter(job_id=job_id).only("state", "kill_requested").first()
    if workload is None or workload.state != WorkloadState.STOPPING:
        return ""
    return "kill" if workload.kill_requested else "stop"


def devices_for(job_id: int) -> int:
    """The devices the job runs on now (1 without a workload)."""
    workload = Workload.objects.filter(job_id=job_id).only("allocation").first()
    return workload.devices if workload and workload.devices else 1


def record_checkpoint(job_id: int, at: datetime) -> None:
    Workload.objects.filter(job_id=job_id).exclude(last_checkpoint_at=at).update(last_checkpoint_at=at)


def hand_back(job: Job) -> Job:
    """The job's process stopped at a checkpoint as the pool asked: restart it on its new size, or requeue it to
    wait for devices (it resumes from that checkpoint either way)."""
    now = timezone.now()
    workload = Workload.objects.select_related("job", "stopped_for").get(job=job)
    hand_over(job.pk)
    _account(workload, now)
    with transaction.atomic():
        if workload.stop_keep:
            Workload.objects.filter(pk=workload.pk).update(
                state=WorkloadState.RUNNING, allocation=workload.stop_keep, started_at=now, stop_keep={},
                stop_requested_at=None, kill_requested=False,
                preemptions=workload.preemptions + (workload.stopped_for_id is not None))
            message = log.RESTARTING(devices=sum(workload.stop_keep.values()))
        else:
            Workload.objects.filter(pk=workload.pk).update(
                state=WorkloadState.WAITING, allocation={}, started_at=None, stop_requested_at=None,
                kill_requested=False, preemptions=workload.preemptions + 1)
            message = log.REQUEUED(devices=workload.min_devices, kind=workload.device_kind)
        Job.objects.filter(pk=job.pk).update(state=JobState.QUEUED)
        JobEvent.objects.create(job=job, state=JobState.QUEUED, message=message)
        if workload.stop_keep:
            node = Node.objects.get(name=next(iter(workload.stop_keep)))
            transaction.on_commit(lambda: _send(job.pk, node, job.workspace_id))
    transaction.on_commit(schedule_now)
    job.refresh_from_db()
    return job
