import ipaddress
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Count, OuterRef, QuerySet, Subquery

from cluster.models import Node
from workbridge import mcp_catalogue
from workbridge.egress import Allowlist
from workbridge.models import ApiSpec, EgressRule, Invocation, McpServer, Secret, Tool


def allowlist_for(*, workspace_id: int | None) -> Allowlist:
    """What a workspace's user-supplied URLs may reach beyond public addresses: the platform's FACTORY_EGRESS_ALLOW
    and the workspace's own rules. Shared (platform) objects get the platform's only. The platform's own services
    (its web port and Redis, on loopback and on its nodes) stay shut to any rule that does not name their port."""
    entries = [] if workspace_id is None else list(
        EgressRule.objects.filter(workspace_id=workspace_id).values_list("entry", flat=True))
    return Allowlist.of(entries, operator_entries=settings.EGRESS_ALLOW, own_ports=_own_ports(),
                        own_addresses=_node_addresses())


def _own_ports() -> set[int]:
    ports = {int(settings.WEB_PORT)}
    redis_port = urlsplit(settings.REDIS_URL).port
    return ports | ({redis_port} if redis_port else set())


def _node_addresses() -> list[str]:
    addresses = []
    for address in Node.objects.values_list("address", flat=True):
        try:
            addresses.append(str(ipaddress.ip_address(address)))
        except ValueError:
            continue  # a node known by name: its name is no address to compare with
    return addresses


def tools(*, workspace) -> QuerySet[Tool]:
    return Tool.objects.filter(workspace=workspace).select_related("workspace", "spec", "mcp_server")


def tools_with_last_call(*, workspace) -> QuerySet[Tool]:
    """The workspace's tools, each with the status and time of its latest call (None before the first)."""
    latest = Invocation.objects.filter(tool=OuterRef("pk")).order_by("-created_at", "-id")
    return tools(workspace=workspace).annotate(last_status=Subquery(latest.values("status")[:1]),
                                               last_called=Subquery(latest.values("created_at")[:1]),
                                               calls=Count("invocations"))


def api_specs(*, workspace) -> QuerySet[ApiSpec]:
    return ApiSpec.objects.filter(workspace=workspace).annotate(tool_count=Count("tools"))


def mcp_servers(*, workspace) -> QuerySet[McpServer]:
    return McpServer.objects.filter(workspace=workspace).annotate(tool_count=Count("tools"))


def secrets(*, workspace) -> QuerySet[Secret]:
    return Secret.objects.filter(workspace=workspace)


def egress_rules(*, workspace) -> QuerySet[EgressRule]:
    return EgressRule.objects.filter(workspace=workspace)


def platform_allowlist() -> list[str]:
    return list(settings.EGRESS_ALLOW)


def mcp_command_catalogue() -> list[dict]:
    """The operator's local MCP commands, as a workspace admin chooses among them."""
    return [{"name": entry.name, "description": entry.description, "command": list(entry.command),
             "arguments": list(entry.arguments), "sandboxed": entry.sandbox, "reason": entry.reason,
             "installed": entry.executable() is not None} for entry in mcp_catalogue.entries().values()]


def mcp_server_sandboxing(server: McpServer) -> tuple[bool, str]:
    """Whether a local server runs in the sandbox, and if not, the operator's reason."""
    if not server.catalog_entry:
        return True, ""
    try:
        entry = mcp_catalogue.entries().get(server.catalog_entry)
    except mcp_catalogue.CatalogueRefused:
        entry = None  # the page's call to the server says what is wrong with the catalogue
    return (True, "") if entry is None or entry.sandbox else (False, entry.reason)
