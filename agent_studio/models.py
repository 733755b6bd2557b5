import uuid

from django.conf import settings as conf
from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace
from agent_studio.runs.fields import EvalRunFields, LeasedRunFields

# Workflows live in their own package of this app (agent_studio/workflows/): a models package's way, their models are
# this app's by being imported here.
from agent_studio.workflows.models import (  # noqa: F401
    NodeRun,
    NodeStatus,
    Workflow,
    WorkflowEvalRun,
    WorkflowRun,
    WorkflowScenario,
    WorkflowVersion,
)


class AgentTemplate(models.TextChoices):
    TOOL_CALLING = "tool_calling", _("Tool-calling assistant")
    PLAN_EXECUTE = "plan_execute", _("Plan and execute")
    TEAM = "team", _("Team (a supervisor and its sub-agents)")


class ToolStrategy(models.TextChoices):
    NATIVE = "native", _("OpenAI tools through the gateway")
    JSON = "json", _("JSON reply held to a schema")
    REACT_TEXT = "react_text", _("Thought / Action / Observation text")


class Agent(models.Model):
    """An agent: a template run on LangGraph with a model, tools, knowledge bases, memory and limits. Every save
    that changes its settings writes a new AgentVersion; runs, evaluations and apps use a version."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=64)
    description = models.CharField(max_length=500, blank=True)
    template = models.CharField(max_length=16, choices=AgentTemplate.choices)
    # The latest version's settings (agent_studio/settings.py documents and checks them).
    settings = models.JSONField(default=dict)
    version = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(conf.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_agent_name")]

    def __str__(self) -> str:
        return self.name


class AgentVersion(models.Model):
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    settings = models.JSONField()
    checksum = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["agent", "number"], name="unique_agent_version")]

    def __str__(self) -> str:
        return f"{self.agent.name} v{self.number}"


class ThreadSource(models.TextChoices):
    DEBUG = "debug", _("Debug chat")
    APP = "app", _("Published app")
    EVAL = "eval", _("Evaluation")


class AgentThread(models.Model):
    """A conversation with an agent: its LangGraph thread (short-term memory, checkpointed) and the scope of its
    conversation variables."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="threads")
    public_id = models.UUIDField(default=uuid.uuid4, unique=True)
    end_user = models.CharField(max_length=128)
    source = models.CharField(max_length=8, choices=ThreadSource.choices, default=ThreadSource.DEBUG)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]


class AgentRun(LeasedRunFields):
    """One turn of a thread: the input, every step taken (RunStep), and the answer or the reason there is none.

    A run belongs to its workspace: when its agent is deleted with its runs kept, the run stays, without agent,
    version and thread, under the agent's name (agent_studio.services.delete_agent)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="agent_runs")
    agent = models.ForeignKey(Agent, on_delete=models.SET_NULL, null=True, related_name="runs")
    # The name of its agent once that agent is deleted.
    agent_name = models.CharField(max_length=64, blank=True)
    version = models.ForeignKey(AgentVersion, on_delete=models.SET_NULL, null=True, related_name="runs")
    thread = models.ForeignKey(AgentThread, on_delete=models.SET_NULL, null=True, related_name="runs")
    input = models.TextField()
    # Earlier turns to start a new thread with ([{"role", "content"}]), as an evaluation scenario gives them.
    prior_messages = models.JSONField(default=list, blank=True)
    # The plan shown for approval (plan-and-execute), as edited when approved.
    plan = models.JSONField(default=list, blank=True)
    citations = models.JSONField(default=list, blank=True)
    model_calls = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)


class StepKind(models.TextChoices):
    PLAN = "plan", _("Plan")
    MODEL = "model", _("Model call")
    TOOL = "tool", _("Tool call")
    MEMORY = "memory", _("Memory write")
    ERROR = "error", _("Error")
    ANSWER = "answer", _("Answer")


class RunStep(models.Model):
    """One thing a run did, in order: shown live in the debug chat and kept as the run's trace."""

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=StepKind.choices)
    name = models.CharField(max_length=128, blank=True)
    detail = models.JSONField(default=dict)
    ok = models.BooleanField(default=True)
    latency_ms = models.FloatField(null=True)
    input_tokens = models.PositiveIntegerField(null=True)
    output_tokens = models.PositiveIntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="unique_run_step")]


class VariableScope(models.TextChoices):
    CONVERSATION = "conversation", _("Conversation")
    END_USER = "end_user", _("End user")
    APP = "app", _("App (every conversation)")


class VariableValue(models.Model):
    """The value of one of an agent's named memory variables in one scope: a conversation, an end user, or the
    whole agent."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="variable_values")
    name = models.CharField(max_length=64)
    scope = models.CharField(max_length=16, choices=VariableScope.choices)
    scope_key = models.CharField(max_length=128)
    value = models.JSONField(null=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "name", "scope", "scope_key"],
                                               name="unique_variable_value")]


class Scenario(models.Model):
    """A task an agent is scored on: an input (and optional earlier turns), checks on the final answer, the tool
    calls expected and forbidden, and the memory writes expected."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="scenarios")
    name = models.CharField(max_length=120)
    input = models.TextField()
    history = models.JSONField(default=list, blank=True)
    # [{"kind": one of agent_studio.services.SCENARIO_CHECK_KINDS, ...}]; agent_studio/evaluation.py checks them.
    checks = models.JSONField(default=list, blank=True)
    expected_tools = models.JSONField(default=list, blank=True)
    tools_in_order = models.BooleanField(default=False)
    forbidden_tools = models.JSONField(default=list, blank=True)
    expected_memory = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["agent", "name"], name="unique_scenario_name")]


class AgentEvalRun(EvalRunFields):
    """An agent version scored on its scenarios (business, performance) and on the shipped probe suite (safety)."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="eval_runs")
    version = models.ForeignKey(AgentVersion, on_delete=models.CASCADE, related_name="eval_runs")


class MemoryItem(models.Model):
    """One long-term memory of the LangGraph Store (agent_studio/store.py): a JSON value under a namespace
    (agent, end user) and key, with the embedding of its text for search."""

    namespace = models.CharField(max_length=400)
    key = models.CharField(max_length=200)
    value = models.JSONField()
    vector = models.BinaryField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "key"], name="unique_memory_item")]
