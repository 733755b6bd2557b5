"""What every GUI view shares: the signed-in actor, the current workspace and role, and service errors shown as
messages instead of error pages."""

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render

from accounts.errors import ApplicationError, NotFound, in_request_language
from accounts.models import ROLE_RANK, rank_of
from accounts.selectors import effective_role
from accounts.services import Actor


def gui_actor(request) -> Actor:
    return Actor(user=request.user, ip=request.META.get("REMOTE_ADDR"))


def workspace_page(view):
    """A signed-in page inside the current workspace. The view gets `request.workspace_role`; a service error
    raised while handling a form becomes a message on the page the user came from, except "not found", which is
    a 404."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.workspace is None:
            return render(request, "accounts/no_workspace.html", status=403)
        request.workspace_role = effective_role(user=request.user, api_key=None, workspace=request.workspace)
        try:
            return view(request, *args, **kwargs)
        except NotFound as exc:
            # Another workspace's object is a missing one: the page is 404, whatever the form was.
            raise Http404(exc.message)
        except ApplicationError as exc:
            messages.error(request, in_request_language(exc.message))
            return redirect(request.META.get("HTTP_REFERER") or request.path)

    return wrapper


def has_role(request, role: str) -> bool:
    return rank_of(request.workspace_role) >= ROLE_RANK[role]
