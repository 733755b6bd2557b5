from django.db.models import QuerySet

from accounts.models import ROLE_RANK, ApiKey, AuditEntry, Membership, Role, Workspace, capped_by_key, rank_of


def workspaces_for(*, user) -> QuerySet[Workspace]:
    if not user.is_authenticated:
        return Workspace.objects.none()
    return Workspace.objects.filter(memberships__user=user).order_by("name")


def members_of(*, workspace: Workspace) -> QuerySet[Membership]:
    return Membership.objects.filter(workspace=workspace).select_related("user").order_by("user__username")


def effective_role(*, user, api_key: ApiKey | None, workspace: Workspace) -> str | None:
    """The role a request acts with: the member's role, capped by the key's when it comes through a key."""
    membership = Membership.objects.filter(user=user, workspace=workspace).only("role").first()
    return capped_by_key(membership.role, api_key) if membership is not None else None


def api_keys_visible_to(*, user, workspace: Workspace, role: str) -> QuerySet[ApiKey]:
    keys = ApiKey.objects.filter(workspace=workspace).select_related("created_by")
    if rank_of(role) < ROLE_RANK[Role.ADMIN]:
        keys = keys.filter(created_by=user)
    return keys


def audit_entries(*, workspace: Workspace) -> QuerySet[AuditEntry]:
    return AuditEntry.objects.filter(workspace=workspace).select_related("actor", "api_key")


def workspace_of_member(*, user, workspace_id) -> Workspace | None:
    return workspaces_for(user=user).filter(pk=workspace_id).first()
