from django.db import models

from accounts.models import Workspace
from cluster.scheduling.policy import PRIORITY_CLASSES


class NodeStatus(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy"


class Node(models.Model):
    """A machine in the pool. Its Celery worker listens on the queue `node.<name>`."""

    name = models.SlugField(max_length=64, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    # Where its engine replicas listen (FACTORY_NODE_ADDRESS of its worker), reached by the gateway.
    address = models.CharField(max_length=255, default="127.0.0.1")
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_bytes = models.BigIntegerField(default=0)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.HEALTHY)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    # Readings from the last heartbeat: load, free memory, software versions.
    info = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return f"node.{self.name}"


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, default="gpu")
    name = models.CharField(max_length=128)
    uuid = models.CharField(max_length=128, blank=True)
    memory_bytes = models.BigIntegerField(default=0)
    # Dense FP16/BF16 tensor throughput, used by planners to share work across unlike devices; null when unknown.
    compute_tflops = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="one_device_per_index")]


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FINISHED_JOB_STATES = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}


class Job(models.Model):
    """Work for one node (serving, training), run by the node's worker. Every state change is a JobEvent."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True, blank=True, related_name="jobs")
    kind = models.CharField(max_length=64)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="jobs")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    progress = models.FloatField(default=0.0)
    payload = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    state = models.CharField(max_length=16, choices=JobState.choices)
    message = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]


# Training's classes, lowest first, as the policy orders them. Inference replicas have a class of their own: their
# start and stop jobs never wait on the pool (they hold no training quota).
PriorityClass = models.TextChoices("PriorityClass", [(name.upper(), name) for name in PRIORITY_CLASSES])


class DeviceQuota(models.Model):
    """A workspace's queue in the pool for one device kind: devices guaranteed (`nominal`), how many idle devices
    beyond them it may borrow (null: any), and how many of its idle quota devices others may borrow (null: all)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="device_quotas")
    device_kind = models.CharField(max_length=128)
    nominal = models.PositiveIntegerField(default=0)
    borrowing_limit = models.PositiveIntegerField(null=True, blank=True)
    lending_limit = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["device_kind", "workspace"]
        constraints = [models.UniqueConstraint(fields=["workspace", "device_kind"], name="one_quota_per_kind")]


class WorkloadState(models.TextChoices):
    WAITING = "waiting", "Waiting"
    RUNNING = "running", "Running"
    # Told to checkpoint at its next step boundary, then stop (preempted) or restart on another size.
    STOPPING = "stopping", "Stopping"
    FINISHED = "finished", "Finished"


class Workload(models.Model):
    """A job's claim on pool devices: `min_devices`..`max_devices` of one kind, placed all or nothing by the
    pool's scheduler (cluster/scheduling/), which sends the job's message only once it is admitted."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="workload")
    device_kind = models.CharField(max_length=128)
    min_devices = models.PositiveIntegerField(default=1)
    max_devices = models.PositiveIntegerField(default=1)
    # Device counts it can run on (an elastic job's global batch divides by them); empty: any from min to max.
    sizes = models.JSONField(default=list, blank=True)
    spread = models.BooleanField(default=False)
    # Nodes it may run on (its files are there); empty: any.
    nodes = models.JSONField(default=list, blank=True)
    priority = models.CharField(max_length=16, choices=PriorityClass.choices, default=PriorityClass.NORMAL)
    state = models.CharField(max_length=16, choices=WorkloadState.choices, default=WorkloadState.WAITING)
    allocation = models.JSONField(default=dict, blank=True)  # node name -> devices held
    reason = models.TextField(blank=True)
    submitted_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # What a stopping workload keeps: empty when preempted (requeued), else the size it restarts on.
    stop_keep = models.JSONField(default=dict, blank=True)
    stopped_for = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Still running past the grace period after the signal: its worker stops the process (losing the work since the
    # last checkpoint).
    kill_requested = models.BooleanField(default=False)
    nominated = models.JSONField(default=list, blank=True)  # nodes where room is being made for it
    preemptions = models.PositiveIntegerField(default=0)
    device_seconds = models.FloatField(default=0.0)
    accounted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["submitted_at", "id"]

    @property
    def devices(self) -> int:
        return sum(self.allocation.values())
