from django.conf import settings
from django.db import models
from django.template.defaultfilters import filesizeformat
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace
from cluster.models import Node
from workbridge.vault import EncryptedTextField


class ModelKind(models.TextChoices):
    GGUF = "gguf", _("GGUF file")
    HF = "hf", _("Hugging Face directory")
    EXTERNAL = "external", _("External OpenAI-compatible endpoint")


class RoleHint(models.TextChoices):
    BIG = "big", _("Big")
    SMALL = "small", _("Small")
    EMBEDDING = "embedding", _("Embedding")


class Model(models.Model):
    """A registered artefact. Shared models (presets) have no workspace and are visible to every workspace."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    name = models.SlugField(max_length=96)
    kind = models.CharField(max_length=16, choices=ModelKind.choices)
    path = models.CharField(max_length=1024, blank=True)
    url = models.URLField(max_length=512, blank=True)
    # An external endpoint's key, encrypted at rest (workbridge/vault.py).
    api_key = EncryptedTextField(blank=True)
    family = models.CharField(max_length=64, blank=True)
    parameter_count = models.BigIntegerField(null=True, blank=True)
    quantization = models.CharField(max_length=32, blank=True)
    context_length = models.PositiveIntegerField(null=True, blank=True)
    embedding_dimensions = models.PositiveIntegerField(null=True, blank=True)
    chat_template = models.TextField(blank=True)
    role_hint = models.CharField(max_length=16, choices=RoleHint.choices, default=RoleHint.SMALL)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_model_name_per_workspace")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_embedding(self) -> bool:
        return self.role_hint == RoleHint.EMBEDDING

    @property
    def size_label(self) -> str:
        """The weights' size as every page shows it; "—" for an endpoint elsewhere, whose weights are not here."""
        if self.kind == ModelKind.EXTERNAL or not self.size_bytes:
            return "—"
        return filesizeformat(self.size_bytes)

    @property
    def supports_chat(self) -> bool:
        """A base model without a chat template answers chat requests with nothing, so it is completion-only."""
        return not self.is_embedding and (self.kind == ModelKind.EXTERNAL or bool(self.chat_template))


class Engine(models.TextChoices):
    LLAMACPP = "llamacpp", _("llama.cpp (CPU, GGUF)")
    VLLM = "vllm", _("vLLM (GPU)")
    EMBEDDING = "embedding", _("Sentence-transformers embeddings")
    EXTERNAL = "external", _("External URL")


# The node jobs of a replica's life (cluster jobs on the replica's node; serving/services.py handles them).
START_REPLICA, STOP_REPLICA = "serving.start_replica", "serving.stop_replica"
# Stops an engine process by its pid on its node, for a replica whose row is gone (its deployment was deleted).
STOP_ENGINE = "serving.stop_engine"


class ServingState(models.TextChoices):
    PENDING = "pending", _("Pending")
    STARTING = "starting", _("Starting")
    READY = "ready", _("Ready")
    DRAINING = "draining", _("Draining")
    STOPPED = "stopped", _("Stopped")
    FAILED = "failed", _("Failed")


class ToolStrategy(models.TextChoices):
    NATIVE = "native", _("Native: the engine's own tool calls")
    CONSTRAINED = "constrained", _("Constrained: the gateway's JSON-schema tool calls")


class Deployment(models.Model):
    """A model served by an engine with settings, over N weighted replicas. Its `name` is what clients pass as
    `model` to the gateway."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    name = models.SlugField(max_length=96, unique=True)
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="deployments")
    engine = models.CharField(max_length=16, choices=Engine.choices)
    # Engine settings: context_length, threads, gpu_layers, tensor_parallel_size.
    settings = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=ServingState.choices, default=ServingState.PENDING)
    # What the user asked for last (start or stop); `make run` brings running deployments back up.
    desired_running = models.BooleanField(default=False)
    # How long a replica that failed a request is left out of routing.
    cooldown_s = models.FloatField(default=30.0)
    # How the gateway serves `tools`, probed from the engine each time a replica starts (serving/toolcalls.py).
    tool_strategy = models.CharField(max_length=16, choices=ToolStrategy.choices, default=ToolStrategy.NATIVE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def stoppable(self) -> bool:
        """Whether its page offers Stop (it runs, or is on its way up) rather than Start (stopped, failed, or never
        started)."""
        return self.state in (ServingState.STARTING, ServingState.READY) or (
            self.state == ServingState.PENDING and self.desired_running)


class Replica(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replicas")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="replicas")
    weight = models.FloatField(default=1.0)
    state = models.CharField(max_length=16, choices=ServingState.choices, default=ServingState.PENDING)
    base_url = models.CharField(max_length=255, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    # The key its engine process requires (made anew at each start, encrypted at rest): only the gateway and the
    # node's worker hold it, so the engine's port is useless on its own.
    api_key = EncryptedTextField(blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    next_restart_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_health_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["deployment", "id"]


class ServingEvent(models.Model):
    """Every state transition of a deployment or one of its replicas."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    replica = models.ForeignKey(Replica, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    message = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]


class RequestRecord(models.Model):
    """One gateway request with its latency figures (definitions in serving/metrics.py)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.SET_NULL, null=True, related_name="requests")
    replica = models.ForeignKey(Replica, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    workspace = models.ForeignKey(Workspace, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # Returned to the client as X-Request-Id, so a caller can look up the figures of its own request.
    request_id = models.CharField(max_length=32, db_index=True, blank=True)
    endpoint = models.CharField(max_length=32)
    stream = models.BooleanField(default=False)
    status = models.PositiveSmallIntegerField()
    attempts = models.PositiveSmallIntegerField(default=1)
    ttft_ms = models.FloatField(null=True, blank=True)
    tpot_ms = models.FloatField(null=True, blank=True)
    itl_mean_ms = models.FloatField(null=True, blank=True)
    e2e_ms = models.FloatField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Set when the request came through a model group (its GroupRequest says which member and why).
    group = models.ForeignKey("ModelGroup", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class GroupPolicy(models.TextChoices):
    ROUTE = "route", _("Route: a difficulty score picks the member before generation")
    CASCADE = "cascade", _("Cascade: the small model answers first; escalate to big when its confidence is low")
    SPECULATIVE = "speculative", _("Speculative: the big model decodes with a draft model of the same vocabulary")


class GroupMember(models.TextChoices):
    BIG = "big", _("Big")
    SMALL = "small", _("Small")


class ModelGroup(models.Model):
    """One name in /v1 with a big and a small deployment behind it and the policy that picks, per request, which
    of them answers (serving/groups/). Its name shares the deployments' namespace: `model` names either."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    name = models.SlugField(max_length=96, unique=True)
    policy = models.CharField(max_length=16, choices=GroupPolicy.choices)
    big = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="+")
    small = models.ForeignKey(Deployment, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    # Speculative only: the draft model, and the deployment of the big model that decodes with it.
    draft = models.ForeignKey(Model, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    speculative_deployment = models.ForeignKey(Deployment, on_delete=models.SET_NULL, null=True, blank=True,
                                               related_name="+")
    # Route: the big model answers when the difficulty score is at or above it. Cascade: the small answer is kept
    # when its confidence is at or above it. Both in [0, 1].
    threshold = models.FloatField(default=0.5)
    # The policy's knobs (serving/groups/policies.py): the route's rules, the cascade's confidence signal.
    settings = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class GroupRequest(models.Model):
    """Which member answered one request through a group, and why: the score against the threshold, whether the
    cascade escalated, a fallback when a member could not answer, and each member's tokens and their cost."""

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="requests")
    workspace = models.ForeignKey(Workspace, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # The X-Request-Id the client got; the answering member's RequestRecord carries the same id.
    request_id = models.CharField(max_length=32, db_index=True)
    policy = models.CharField(max_length=16, choices=GroupPolicy.choices)
    member = models.CharField(max_length=8, choices=GroupMember.choices)
    score = models.FloatField(null=True, blank=True)
    threshold = models.FloatField()
    escalated = models.BooleanField(default=False)
    reason = models.TextField()
    fallback = models.TextField(blank=True)
    status = models.PositiveSmallIntegerField()
    small_input_tokens = models.PositiveIntegerField(default=0)
    small_output_tokens = models.PositiveIntegerField(default=0)
    big_input_tokens = models.PositiveIntegerField(default=0)
    big_output_tokens = models.PositiveIntegerField(default=0)
    # In the group's cost units (settings: cost per 1,000 tokens of each member; by default its parameters in
    # millions, so the figure tracks compute).
    small_cost = models.FloatField(default=0.0)
    big_cost = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class CalibrationState(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class CalibrationRun(models.Model):
    """Both members run on prompts with reference answers, each answer scored, the threshold swept: the
    cost-quality curve of each policy (serving/groups/calibration.py), from which the user picks a point."""

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="calibrations")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    state = models.CharField(max_length=16, choices=CalibrationState.choices, default=CalibrationState.QUEUED)
    source = models.CharField(max_length=200)
    metric = models.CharField(max_length=16)
    # metric "judge": the chat deployment (or group) that grades each answer against the reference.
    judge = models.CharField(max_length=96, blank=True)
    # The requests calibration sends each member, as the group will see them.
    max_tokens = models.PositiveIntegerField(default=128)
    temperature = models.FloatField(default=0.2)
    # [{"prompt", "reference"}], as given.
    items = models.JSONField(default=list)
    # Per item: each member's answer, score and tokens, the small answer's confidence, the route's score.
    outcomes = models.JSONField(default=list, blank=True)
    # {"route": [point...], "cascade": [point...]}; a point: threshold, big share of requests and of tokens,
    # quality, quality relative to big-only.
    curves = models.JSONField(default=dict, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    chosen = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
