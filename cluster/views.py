from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.gui import gui_actor, workspace_page
from accounts.models import Workspace
from accounts.services import is_platform_admin
from cluster import selectors
from cluster.scheduling import selectors as pool_selectors, services as pool_services


@login_required
def pool(request):
    jobs = selectors.jobs_for(workspace=request.workspace)[:20] if request.workspace else []
    everything = is_platform_admin(gui_actor(request))
    return render(request, "cluster/pool.html", {
        "nodes": selectors.nodes(),
        "summary": selectors.pool_summary(),
        "jobs": jobs,
        "pool": pool_selectors.pool_view(workspace=request.workspace, everything=everything),
        "may_set_quotas": everything,
        "workspaces": Workspace.objects.order_by("slug") if everything else [],
    })


def _count(text: str) -> int | None:
    """A form's device count; blank is "no limit"."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else None if not text else -1


@workspace_page
@require_POST
def set_quota(request):
    post = request.POST
    workspace = get_object_or_404(Workspace, slug=post.get("workspace"))
    pool_services.set_quota(actor=gui_actor(request), workspace=workspace, device_kind=post.get("device_kind", ""),
                            nominal=_count(post.get("nominal")) or 0,
                            borrowing_limit=_count(post.get("borrowing_limit")),
                            lending_limit=_count(post.get("lending_limit")))
    messages.success(request, _("Quota saved; running work is never stopped by it."))
    return redirect("cluster")
