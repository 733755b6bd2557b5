"""What an agent run and a workflow run (and their evaluations) both are: their states and the fields they share,
as abstract models each app model extends."""

import uuid

from django.conf import settings as conf
from django.db import models
from django.utils.translation import gettext_lazy as _


class RunStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    AWAITING_APPROVAL = "awaiting_approval", _("Awaiting plan approval")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


FINAL_RUN_STATES = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED)


class LeasedRunFields(models.Model):
    """What an agent run and a workflow run both carry: who asked, the state, the answer or the error, the tokens
    and time spent, and the lease the worker running it holds."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True)
    caller = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    answer = models.TextField(blank=True)
    error = models.TextField(blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField(null=True)
    # Who runs it now: a worker renews the lease while it works; beat resumes a run whose lease ran out.
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    created_by = models.ForeignKey(conf.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    @property
    def finished(self) -> bool:
        return self.status in FINAL_RUN_STATES


class EvalStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class EvalRunFields(models.Model):
    """What an agent's and a workflow's evaluations both carry: the state, how far it got, the scores on the three
    axes and each scenario's and probe's result."""

    status = models.CharField(max_length=16, choices=EvalStatus.choices, default=EvalStatus.QUEUED)
    include_safety = models.BooleanField(default=True)
    progress = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    scores = models.JSONField(default=dict, blank=True)
    results = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(conf.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]
