from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace
from workbridge.vault import EncryptedTextField, mask


class EgressRule(models.Model):
    """A host (`api.corp.example`, `*.corp.example`) or network (`10.1.0.0/16`) the workspace's user-supplied URLs
    may reach though it is not public: an intranet API, say. Set by the workspace's admins."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="egress_rules")
    entry = models.CharField(max_length=255)
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["entry"]
        constraints = [models.UniqueConstraint(fields=["workspace", "entry"], name="unique_egress_rule")]

    def __str__(self) -> str:
        return self.entry


class Binding(models.TextChoices):
    HTTP = "http", _("HTTP request")
    OPENAPI = "openapi", _("OpenAPI operation")
    PYTHON = "python", _("Python function")
    MCP = "mcp", _("MCP server tool")


class ApiSpec(models.Model):
    """An imported OpenAPI or Swagger document, stored once and shared by the tools made from its operations."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_specs")
    title = models.CharField(max_length=200)
    version = models.CharField(max_length=64, blank=True)
    # Where it came from: the URL it was fetched from, or "upload" / "pasted".
    source = models.CharField(max_length=2000)
    base_url = models.CharField(max_length=2000)
    document = models.JSONField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.title


class McpTransport(models.TextChoices):
    HTTP = "http", _("Streamable HTTP")
    STDIO = "stdio", _("Local command (stdio)")


class McpServer(models.Model):
    """An MCP server whose tools the workspace imports: reached at a URL through the egress guard, or started as a
    local command from the operator's catalogue, sandboxed, since it runs on the platform's own machine."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.CharField(max_length=64)
    transport = models.CharField(max_length=8, choices=McpTransport.choices)
    url = models.CharField(max_length=2000, blank=True)
    # A local server is an entry of the operator's catalogue (workbridge/mcp_catalogue.py) with the extra arguments
    # the entry allows, or, registered by a platform administrator signed in, a free-form `command`.
    catalog_entry = models.CharField(max_length=64, blank=True)
    arguments = models.JSONField(default=list, blank=True)
    command = models.JSONField(default=list, blank=True)
    # Why the platform will not start or call this server (shown on its page); blank while it may.
    disabled_reason = models.TextField(blank=True)
    # A workspace secret sent as `Authorization: Bearer …` to an HTTP server.
    auth_secret = models.CharField(max_length=64, blank=True)
    timeout_s = models.FloatField(default=30.0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_mcp_server_name")]

    def __str__(self) -> str:
        return self.name


class Tool(models.Model):
    """Something a model can call: a name and description written for the model, a JSON Schema for the arguments,
    and a binding that says what a call does: an HTTP request, an operation of an imported spec, a Python function
    run in the sandbox, or a tool of an MCP server."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=64)
    description = models.TextField()
    binding = models.CharField(max_length=16, choices=Binding.choices, default=Binding.HTTP)
    parameters = models.JSONField(default=dict)
    # What a call must answer, when set: a JSON Schema an answer is checked against (a mismatch fails the call).
    output_schema = models.JSONField(null=True, blank=True)
    # The binding's own settings. http and openapi: the request (workbridge/http_tools.py); python: {"code": ...};
    # mcp: {"tool": the server's name for it}.
    config = models.JSONField(default=dict)
    spec = models.ForeignKey(ApiSpec, on_delete=models.PROTECT, null=True, blank=True, related_name="tools")
    mcp_server = models.ForeignKey(McpServer, on_delete=models.PROTECT, null=True, blank=True, related_name="tools")
    timeout_s = models.FloatField(default=30.0)
    max_output_bytes = models.PositiveIntegerField(default=1_048_576)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_tool_name")]

    def __str__(self) -> str:
        return self.name


class Secret(models.Model):
    """A credential tools send (a bearer token, an API key), encrypted at rest and never shown again in full."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=64)
    value = EncryptedTextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_secret_name")]

    def __str__(self) -> str:
        return self.name

    @property
    def masked(self) -> str:
        return mask(self.value)


class InvocationStatus(models.TextChoices):
    OK = "ok", _("OK")
    FAILED = "failed", _("Failed")


class Invocation(models.Model):
    """One call of a tool, from whichever caller: its arguments (secrets never among them), what came back, how
    long it took, and why it failed."""

    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="invocations")
    caller = models.CharField(max_length=64)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    arguments = models.JSONField(default=dict)
    status = models.CharField(max_length=8, choices=InvocationStatus.choices)
    http_status = models.PositiveSmallIntegerField(null=True)
    latency_ms = models.FloatField()
    result_excerpt = models.TextField(blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
