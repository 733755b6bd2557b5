from django.db import models

from accounts.models import Workspace


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
