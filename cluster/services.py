import logging
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.errors import Conflict, NotFound, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from cluster import cpu_budget, inventory, log_messages as log, queues
from cluster.jobs import handler_for, job_handler, known_kinds, submittable_kinds
from cluster.models import FINISHED_JOB_STATES, Device, Job, JobEvent, JobState, Node, NodeStatus, Workload
from cluster.scheduling import pool
from cluster.scheduling.pool import DeviceRequest, Preempted
from cluster.scheduling.services import check_request

logger = logging.getLogger(__name__)
RUN_JOB_TASK = "cluster.tasks.run_job"


@transaction.atomic
def register_node(*, name: str, resources: inventory.Resources, address: str = "127.0.0.1") -> Node:
    """Add or refresh a node and its devices from a reading of its resources; `address` is where its engine
    replicas listen."""
    node, _ = Node.objects.update_or_create(
        name=name,
        defaults={
            "hostname": resources.hostname,
            "address": address,
            "cpu_cores": resources.cpu_cores,
            "memory_bytes": resources.memory_bytes,
            "status": NodeStatus.HEALTHY,
            "last_heartbeat_at": timezone.now(),
            "info": _heartbeat_info(resources),
        },
    )
    seen = []
    for gpu in resources.gpus:
        Device.objects.update_or_create(
            node=node, index=gpu.index,
            defaults={"kind": "gpu", "name": gpu.name, "uuid": gpu.uuid, "memory_bytes": gpu.memory_bytes,
                      "compute_tflops": gpu.compute_tflops},
        )
        seen.append(gpu.index)
    node.devices.exclude(index__in=seen).delete()
    return node


def register_local_node() -> Node:
    return register_node(name=settings.NODE_NAME, resources=inventory.probe(), address=settings.NODE_ADDRESS)


def _heartbeat_info(resources: inventory.Resources) -> dict:
    return {
        "memory_available_bytes": resources.memory_available_bytes,
        "load_average": resources.load_average,
        "gpu_error": resources.gpu_error,
        "llama_cuda": resources.llama_cuda,
        **_cpu_budget_info(),
    }


def _cpu_budget_info() -> dict:
    """How the node shares its cores (cluster/cpu_budget.py), for its page; a setting it cannot use is shown
    instead of failing the heartbeat."""
    try:
        return {"cpu_budget": cpu_budget.budget().as_dict()}
    except cpu_budget.BudgetRefused as exc:
        return {"cpu_budget_error": str(exc)}


def record_heartbeat(*, name: str, resources: inventory.Resources) -> Node:
    node = Node.objects.filter(name=name).first()
    if node is None or node.devices.count() != len(resources.gpus):
        return register_node(name=name, resources=resources, address=settings.NODE_ADDRESS)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.HEALTHY, last_heartbeat_at=timezone.now(),
                                           info=_heartbeat_info(resources))
    node.refresh_from_db()
    return node


def mark_stale_nodes(*, timeout_s: int) -> list[str]:
    """Mark unhealthy every node whose worker has not answered a heartbeat within `timeout_s`."""
    cutoff = timezone.now() - timedelta(seconds=timeout_s)
    stale = Node.objects.filter(status=NodeStatus.HEALTHY, last_heartbeat_at__lt=cutoff)
    names = list(stale.values_list("name", flat=True))
    stale.update(status=NodeStatus.UNHEALTHY)
    for name in names:
        logger.warning("Node %s missed its heartbeats for %ss and is now unhealthy", name, timeout_s)
    return names


def _transition(job: Job, state: str, message: str = "", **fields) -> Job:
    now = timezone.now()
    job.state = state
    if state == JobState.RUNNING:
        job.started_at = job.started_at or now
    if state in FINISHED_JOB_STATES:
        job.finished_at = now
    for name, value in fields.items():
        setattr(job, name, value)
    job.save()
    JobEvent.objects.create(job=job, state=state, message=message)
    return job


def dispatch_job(*, actor: Actor, workspace: Workspace | None, kind: str, node: Node,
                 payload: dict | None = None, request: DeviceRequest | None = None) -> Job:
    """Queue a job on the node's own Celery queue. The message is sent only once the job row is committed. A job
    with a device `request` (training) waits for the pool's scheduler to admit it first; one without (a replica's
    start or stop, an inventory) goes straight to its node, as it never waits on training quota."""
    if handler_for(kind) is None:
        raise ValidationFailed(_("Unknown job kind '%(kind)s'. Known kinds: %(kinds)s.")
                               % {"kind": kind, "kinds": ', '.join(known_kinds())})
    if node.status != NodeStatus.HEALTHY:
        raise Conflict(_("Node '%(node)s' is unhealthy: its worker has not answered heartbeats.")
                       % {"node": node.name})
    if request is not None:
        check_request(actor=actor, workspace=workspace, request=request)
    with transaction.atomic():
        job = Job.objects.create(workspace=workspace, kind=kind, node=node, payload=payload or {})
        detail = {"kind": kind, "node": node.name}
        if request is None:
            JobEvent.objects.create(job=job, state=JobState.QUEUED, message=log.QUEUED_ON(queue=node.queue))
            transaction.on_commit(lambda: _send(job))
        else:
            JobEvent.objects.create(job=job, state=JobState.QUEUED, message=log.WAITING_FOR_DEVICES(
                devices=request.min_devices, kind=request.device_kind, priority=request.priority))
            pool.create_workload(job, request)
            detail.update(priority=request.priority, devices=[request.min_devices, request.max_devices])
        record_audit(actor=actor, workspace=workspace, action="job.dispatch", target=job, detail=detail)
    return job


def submit_job(*, actor: Actor, workspace: Workspace, kind: str, node: Node, payload: dict | None = None) -> Job:
    """A job asked for through the generic jobs API: only kinds that act on no other app's objects (a replica's
    start and stop are the deployment's business, and its services check whose it is)."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    if kind not in submittable_kinds():
        if handler_for(kind) is None:
            raise ValidationFailed(_("Unknown job kind '%(kind)s'. Kinds you can submit: %(kinds)s.")
                                   % {"kind": kind, "kinds": ', '.join(submittable_kinds())},
                                   fields={"kind": ["Unknown kind."]})
        raise ValidationFailed(_("Jobs of kind '%(kind)s' are started by their own app (its page or API), not "
                                 "through the jobs API. Kinds you can submit: %(kinds)s.")
                               % {"kind": kind, "kinds": ', '.join(submittable_kinds())},
                               fields={"kind": ["Not submittable."]})
    return dispatch_job(actor=actor, workspace=workspace, kind=kind, node=node, payload=payload)


@transaction.atomic
def cancel_job(*, actor: Actor, job: Job) -> Job:
    if job.workspace is not None:
        require_role(actor=actor, workspace=job.workspace, role=Role.DEVELOPER)
    if job.state in FINISHED_JOB_STATES:
        raise Conflict(_("Job %(job)s has already %(state)s.") % {"job": job.pk, "state": _(job.state)})
    if job.celery_task_id:
        current_app.control.revoke(job.celery_task_id)
    record_audit(actor=actor, workspace=job.workspace, action="job.cancel", target=job)
    if Workload.objects.filter(job=job).exists():
        transaction.on_commit(pool.schedule_now)  # its devices go to the next in line
    return _transition(job, JobState.CANCELLED, log.CANCELLED_BY_USER())


def _send(job: Job) -> None:
    result = queues.send(RUN_JOB_TASK, [job.pk], queue=job.node.queue, workspace_id=job.workspace_id)
    Job.objects.filter(pk=job.pk).update(celery_task_id=result.id)


def job_line(node: Node) -> queues.Line:
    return queues.Line(node.queue, workers=settings.NODE_CONCURRENCY)


def job_place(line: queues.Line, job: Job) -> queues.Place | None:
    """Where a queued job stands in its node's line (replica starts and stops, training, heartbeats); a job still
    waiting for the pool's devices says why."""
    if job.state != JobState.QUEUED:
        return None
    workload = Workload.objects.filter(job=job, state="waiting").only("reason").first()
    if workload is not None:
        return queues.Place(position=0, ahead_in_your_workspace=0, estimated_start_s=None,
                            reason=workload.reason or _("waiting for the pool's scheduler"))
    return line.place(RUN_JOB_TASK, [job.pk], workspace_id=job.workspace_id, default_s=30.0,
                      reason=_("waiting for node %(node)s's worker") % {"node": job.node.name})


def run_job(*, job_id: int, worker: str) -> Job:
    """Run a job's handler on this worker. A finished job is left alone, so a redelivered message is harmless; a
    job found `running` was interrupted by a dying worker and starts again."""
    job = Job.objects.select_related("node").filter(pk=job_id).first()
    if job is None:
        raise NotFound(_("Job %(job_id)s does not exist.") % {"job_id": job_id})
    if job.state in FINISHED_JOB_STATES:
        return job
    if job.node.name != settings.NODE_NAME:
        return _transition(job, JobState.FAILED, error=(
            f"Job for node '{job.node.name}' reached the worker of node '{settings.NODE_NAME}'."))
    note = log.RESTARTED_ON if job.state == JobState.RUNNING else log.STARTED_ON
    _transition(job, JobState.RUNNING, note(worker=worker), worker=worker)

    def report(progress: float, message: str = "") -> None:
        Job.objects.filter(pk=job.pk).update(progress=max(0.0, min(1.0, progress)))
        if message:
            JobEvent.objects.create(job=job, state=JobState.RUNNING, message=message)

    try:
        result = handler_for(job.kind)(job, report)
    except Preempted:
        return pool.hand_back(job)
    except Exception as exc:
        logger.exception("Job %s (%s) failed", job.pk, job.kind)
        job.refresh_from_db()
        return _settled(_transition(job, JobState.FAILED, str(exc), error=str(exc) or exc.__class__.__name__))
    job.refresh_from_db()
    if job.state == JobState.CANCELLED:
        return _settled(job)
    return _settled(_transition(job, JobState.SUCCEEDED, log.DONE(), progress=1.0, result=result or {}))


def _settled(job: Job) -> Job:
    """A job that held pool devices has ended: the next in line gets them now, not at the next tick."""
    if Workload.objects.filter(job=job).exists():
        pool.schedule_now()
    return job


@job_handler("node.inventory", submittable=True)
def refresh_inventory(job: Job, report) -> dict:
    """Re-read this node's CPUs, memory and GPUs (after a GPU was added, say)."""
    report(0.1, "Reading resources")
    resources = inventory.probe()
    register_node(name=settings.NODE_NAME, resources=resources, address=settings.NODE_ADDRESS)
    return resources.as_dict()
