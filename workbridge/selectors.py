from django.conf import settings
from django.db.models import Count, OuterRef, QuerySet, Subquery

from workbridge.egress import Allowlist
from workbridge.models import ApiSpec, EgressRule, Invocation, McpServer, Secret, Tool


def allowlist_for(*, workspace_id: int | None) -> Allowlist:
    """What a workspace's user-supplied URLs may reach beyond public addresses: the platform's FACTORY_EGRESS_ALLOW
    and the workspace's own rules. Shared (platform) objects get the platform's only."""
    entries = list(settings.EGRESS_ALLOW)
    if workspace_id is not None:
        entries += EgressRule.objects.filter(workspace_id=workspace_id).values_list("entry", flat=True)
    return Allowlist.of(entries)


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
