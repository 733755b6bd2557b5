import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace
from agent_studio.models import Agent, AgentRun, AgentVersion
from agent_studio.workflows.models import Workflow, WorkflowRun, WorkflowVersion
from rag_studio.models import EvalItem, RagConfig, RagConfigVersion


class AppKind(models.TextChoices):
    """What an app serves, as every page names it (home, Apps, the app's own page)."""

    RAG = "rag", _("RAG assistant")
    AGENT = "agent", _("Agent")
    WORKFLOW = "workflow", _("Workflow")


class App(models.Model):
    """A published assistant: a RAG config, an agent or a workflow. It serves the version of its current release,
    whatever the studio has saved since, until it is published again."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="apps")
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=96)
    # Exactly one of the three: what the app serves.
    rag_config = models.ForeignKey(RagConfig, on_delete=models.PROTECT, null=True, blank=True, related_name="apps")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, null=True, blank=True, related_name="apps")
    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, null=True, blank=True, related_name="apps")
    current_release = models.ForeignKey("Release", on_delete=models.PROTECT, null=True, related_name="+")
    enabled = models.BooleanField(default=True)
    default_rate_limit = models.PositiveIntegerField(default=60, help_text="Requests per minute per key")
    # The widget's publishable token is meant to sit in other sites' HTML, so it is stored as is; what limits
    # it is the origin list and that it can only chat with this app.
    widget_token = models.CharField(max_length=64, unique=True)
    allowed_origins = models.JSONField(default=list, help_text="Sites that may embed the web chat")
    # What the web chat shows before the first question: a greeting, and questions a visitor can ask in one click.
    opener = models.TextField(blank=True)
    suggested_questions = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.CheckConstraint(
            condition=models.Q(rag_config__isnull=False, agent__isnull=True, workflow__isnull=True)
            | models.Q(rag_config__isnull=True, agent__isnull=False, workflow__isnull=True)
            | models.Q(rag_config__isnull=True, agent__isnull=True, workflow__isnull=False),
            name="app_serves_a_config_an_agent_or_a_workflow")]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_agent(self) -> bool:
        return self.agent_id is not None

    @property
    def is_workflow(self) -> bool:
        return self.workflow_id is not None

    @property
    def kind(self) -> str:
        return AppKind.AGENT if self.is_agent else AppKind.WORKFLOW if self.is_workflow else AppKind.RAG

    @property
    def kind_label(self) -> str:
        return AppKind(self.kind).label

    @property
    def source(self):
        """The studio artefact the app publishes."""
        return self.agent if self.is_agent else self.workflow if self.is_workflow else self.rag_config


class Release(models.Model):
    app = models.ForeignKey(App, on_delete=models.CASCADE, related_name="releases")
    number = models.PositiveIntegerField()
    config_version = models.ForeignKey(RagConfigVersion, on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="releases")
    agent_version = models.ForeignKey(AgentVersion, on_delete=models.PROTECT, null=True, blank=True,
                                      related_name="releases")
    workflow_version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, null=True, blank=True,
                                         related_name="releases")
    published_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    note = models.CharField(max_length=200, blank=True)
    published_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["app", "number"], name="unique_release_number")]

    @property
    def version(self):
        """The RAG config version, agent version or workflow version this release serves."""
        if self.workflow_version_id:
            return self.workflow_version
        return self.agent_version if self.agent_version_id else self.config_version


class AppKey(models.Model):
    app = models.ForeignKey(App, on_delete=models.CASCADE, related_name="keys")
    name = models.CharField(max_length=120)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    rate_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute; empty: the app's")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class Conversation(models.Model):
    app = models.ForeignKey(App, on_delete=models.CASCADE, related_name="conversations")
    public_id = models.UUIDField(default=uuid.uuid4, unique=True)
    end_user = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]


class Channel(models.TextChoices):
    CHAT = "chat", _("Chat API")
    OPENAI = "openai", _("OpenAI-compatible")
    WIDGET = "widget", _("Web chat")
    RETRIEVE = "retrieve", _("Retrieve (debug)")


class TraceStatus(models.TextChoices):
    OK = "ok", _("OK")
    ERROR = "error", _("Error")
    CANCELLED = "cancelled", _("Cancelled")
    AWAITING = "awaiting", _("Awaiting plan approval")


class Trace(models.Model):
    """One call of an app; the turns of a conversation are its traces."""

    app = models.ForeignKey(App, on_delete=models.CASCADE, related_name="traces")
    release = models.ForeignKey(Release, on_delete=models.SET_NULL, null=True, related_name="traces")
    conversation = models.ForeignKey(Conversation, on_delete=models.SET_NULL, null=True, related_name="traces")
    public_id = models.UUIDField(default=uuid.uuid4, unique=True)
    app_key = models.ForeignKey(AppKey, on_delete=models.SET_NULL, null=True, related_name="+")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    end_user = models.CharField(max_length=128, blank=True)
    stream = models.BooleanField(default=False)
    query = models.TextField()
    queries = models.JSONField(default=list, help_text="What retrieval searched for, after any rewriting")
    answer = models.TextField(blank=True)
    hits = models.JSONField(default=list, help_text="[{n, chunk_id, document, score, scores}] in rank order")
    citations = models.JSONField(default=list)
    deployment = models.CharField(max_length=96, blank=True)
    model = models.CharField(max_length=96, blank=True)
    input_tokens = models.PositiveIntegerField(null=True)
    output_tokens = models.PositiveIntegerField(null=True)
    retrieval_ms = models.FloatField(null=True)
    ttft_ms = models.FloatField(null=True)
    latency_ms = models.FloatField(null=True)
    status = models.CharField(max_length=16, choices=TraceStatus.choices, default=TraceStatus.OK)
    error = models.TextField(blank=True)
    # An agent app's run: its steps (plan, model and tool calls) are the trace's detail.
    agent_run = models.ForeignKey(AgentRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # A workflow app's run: its nodes' records (NodeRun) are the trace's detail.
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["app", "created_at"])]


class Feedback(models.Model):
    trace = models.OneToOneField(Trace, on_delete=models.CASCADE, related_name="feedback")
    rating = models.SmallIntegerField(help_text="+1 thumbs up, -1 thumbs down")
    comment = models.TextField(blank=True)
    eval_item = models.ForeignKey(EvalItem, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
