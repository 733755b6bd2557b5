"""Workflows: a versioned graph of typed nodes (agent_studio/workflows/graph.py documents it), its runs, and each
node's record in a run. Imported by agent_studio.models, so these are agent_studio's models (a models package's
way)."""

from django.conf import settings as conf
from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace
from agent_studio.runs.fields import EvalRunFields, LeasedRunFields


class Workflow(models.Model):
    """A graph of nodes wired by edges, with its input variables. Every save that changes the graph writes a new
    WorkflowVersion; a run uses one version."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="workflows")
    name = models.CharField(max_length=64)
    description = models.CharField(max_length=500, blank=True)
    # The latest version's graph, as checked on save.
    graph = models.JSONField(default=dict)
    version = models.PositiveIntegerField(default=0)
    # Where the canvas draws each node, {node id: {"x", "y"}}: shared by every user, but no part of the graph, so
    # moving a node makes no version.
    layout = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(conf.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_workflow_name")]

    def __str__(self) -> str:
        return self.name


class WorkflowVersion(models.Model):
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    graph = models.JSONField()
    checksum = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["workflow", "number"], name="unique_workflow_version")]


class WorkflowRun(LeasedRunFields):
    """One run of a workflow version on its inputs: each node's record (NodeRun), and the answer or the reason
    there is none. Leased like an agent run: a run whose worker died is claimed again and goes on after the nodes
    it had finished."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="workflow_runs")
    workflow = models.ForeignKey(Workflow, on_delete=models.SET_NULL, null=True, related_name="runs")
    workflow_name = models.CharField(max_length=64)
    version = models.ForeignKey(WorkflowVersion, on_delete=models.SET_NULL, null=True, related_name="runs")
    inputs = models.JSONField(default=dict)
    # Every answer node's outputs, by node id.
    outputs = models.JSONField(default=dict, blank=True)


class NodeStatus(models.TextChoices):
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")
    SKIPPED = "skipped", _("Skipped (on a branch not taken)")


class NodeRun(models.Model):
    """What one node did in a run: its resolved inputs, its outputs (or error), timing, tokens and attempts."""

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="nodes")
    index = models.PositiveIntegerField()
    node_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=16)
    status = models.CharField(max_length=8, choices=NodeStatus.choices, default=NodeStatus.RUNNING)
    inputs = models.JSONField(default=dict, blank=True)
    outputs = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    latency_ms = models.FloatField(null=True)
    input_tokens = models.PositiveIntegerField(null=True)
    output_tokens = models.PositiveIntegerField(null=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="unique_node_run"),
                       models.UniqueConstraint(fields=["run", "node_id"], name="unique_node_run_node")]


class WorkflowScenario(models.Model):
    """A case a workflow is scored on: its inputs, checks on the answer (the kinds agents' scenarios have), and
    the nodes the run must go through and must not (the path a triage should take)."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="scenarios")
    name = models.CharField(max_length=120)
    inputs = models.JSONField(default=dict)
    # [{"kind": one of agent_studio.services.SCENARIO_CHECK_KINDS, ...}], checked as an agent's are.
    checks = models.JSONField(default=list, blank=True)
    expected_nodes = models.JSONField(default=list, blank=True)
    forbidden_nodes = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workflow", "name"], name="unique_workflow_scenario_name")]


class WorkflowEvalRun(EvalRunFields):
    """A workflow version scored on its scenarios (business, performance) and, when it is chat-shaped, on the
    shipped probes that attack through the message (safety); agent_studio/workflows/evaluation.py."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="eval_runs")
    version = models.ForeignKey(WorkflowVersion, on_delete=models.CASCADE, related_name="eval_runs")
