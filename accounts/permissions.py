"""The permission layer every API uses: a request acts inside one workspace, with one role, and sees only that
workspace's objects. Another workspace's object is indistinguishable from a missing one (404)."""

from django.utils.translation import gettext as _
from rest_framework.permissions import SAFE_METHODS, BasePermission

from accounts.errors import Forbidden, NotFound
from accounts.models import ROLE_RANK, ApiKey, Role, Workspace, rank_of
from accounts.selectors import effective_role
from accounts.services import Actor


def request_api_key(request) -> ApiKey | None:
    return request.auth if isinstance(request.auth, ApiKey) else None


def request_workspace(request) -> Workspace | None:
    api_key = request_api_key(request)
    if api_key is not None:
        return api_key.workspace
    return getattr(request, "workspace", None)


def request_actor(request) -> Actor:
    user = request.user if request.user.is_authenticated else None
    return Actor(user=user, api_key=request_api_key(request), ip=request.META.get("REMOTE_ADDR"))


class WorkspaceRole(BasePermission):
    """Reads need `view.read_role` (viewer by default), writes `view.write_role` (developer by default)."""

    def has_permission(self, request, view):
        if not request.user.is_authenticated:
            return False
        workspace = request_workspace(request)
        if workspace is None:
            raise NotFound(_("Workspace not found, or you are not a member of it."))
        role = effective_role(user=request.user, api_key=request_api_key(request), workspace=workspace)
        if role is None:
            raise NotFound(_("Workspace not found, or you are not a member of it."))
        needed = getattr(view, "read_role", Role.VIEWER) if request.method in SAFE_METHODS else getattr(
            view, "write_role", Role.DEVELOPER)
        if rank_of(role) < ROLE_RANK[needed]:
            raise Forbidden(_("This needs the %(role)s role in workspace '%(workspace)s'; you are %(held)s.")
                            % {"role": needed, "workspace": workspace.slug, "held": role})
        request.workspace_role = role
        return True


class WorkspaceScopedMixin:
    """For viewsets over models with a `workspace` field: filters every query to the request's workspace."""

    permission_classes = [WorkspaceRole]

    @property
    def workspace(self) -> Workspace:
        return request_workspace(self.request)

    @property
    def actor(self) -> Actor:
        return request_actor(self.request)

    def get_queryset(self):
        return super().get_queryset().filter(workspace=self.workspace)
