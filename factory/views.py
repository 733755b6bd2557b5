"""The shell's own pages: the dashboard that gathers every floor, and health."""

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render

from accounts.errors import error_body
from accounts.selectors import api_keys_visible_to, audit_entries, effective_role
from cluster.selectors import nodes, pool_summary
from runtime.selectors import app_cards


@login_required
def dashboard(request):
    workspace = request.workspace
    context = {"nodes": nodes(), "summary": pool_summary()}
    if workspace is not None:
        role = effective_role(user=request.user, api_key=None, workspace=workspace)
        context["key_count"] = api_keys_visible_to(user=request.user, workspace=workspace, role=role).filter(
            revoked_at__isnull=True).count()
        context["recent"] = audit_entries(workspace=workspace)[:8]
        context["apps"] = app_cards(workspace=workspace)
    return render(request, "dashboard.html", context)


def healthz(request):
    checks = {}
    try:
        connection.ensure_connection()
        checks["database"] = "ok"
    except Exception as exc:  # a health check reports every failure instead of raising
        checks["database"] = str(exc)
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2).ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = str(exc)
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": checks}, status=200 if healthy else 503)


def api_not_found(request, exception=None):
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", f"No API endpoint at {request.path}."), status=404)
    return render(request, "404.html", status=404)


def server_error(request):
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("internal_error", "Something went wrong on our side; it has been logged."),
                            status=500)
    return render(request, "500.html", status=500)
