from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.audit_changes import audit_change_label


class Role(models.TextChoices):
    VIEWER = "viewer", _("Viewer")
    DEVELOPER = "developer", _("Developer")
    ADMIN = "admin", _("Admin")
    OWNER = "owner", _("Owner")


# Each role may do everything the roles before it may.
ROLE_RANK = {Role.VIEWER: 0, Role.DEVELOPER: 1, Role.ADMIN: 2, Role.OWNER: 3}


def rank_of(role: str | None) -> int:
    """A role's rank; a role that is not one of ours (a row edited by hand) ranks below viewer: it may do nothing."""
    return ROLE_RANK.get(role, -1)


def capped_by_key(role: str | None, api_key) -> str | None:
    """The role a member acts with: their own, capped by the API key's when the request comes through one."""
    if role is not None and api_key is not None and rank_of(api_key.role) < rank_of(role):
        return api_key.role
    return role


def _known_role(field: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=models.Q(**{f"{field}__in": Role.values}), name="%(class)s_known_role")


class Workspace(models.Model):
    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.DEVELOPER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="one_membership_per_user"),
                       _known_role("role")]
        ordering = ["workspace", "user__username"]


class KeyScope(models.TextChoices):
    # A workspace key acts in its workspace with its role, nothing more, whoever made it.
    WORKSPACE = "workspace", _("Workspace")
    # A platform key also does a platform administrator's actions (shared models and deployments, model files on
    # the server), each one audited; only a platform administrator in a signed-in session makes one.
    PLATFORM = "platform", _("Platform")


class ApiKey(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=120)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.DEVELOPER)
    scope = models.CharField(max_length=16, choices=KeyScope.choices, default=KeyScope.WORKSPACE)
    # The prefix is shown in lists and used to find the row; only the SHA-256 of the whole key is kept.
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [_known_role("role")]


class AuditEntry(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    @property
    def change_label(self) -> str:
        return audit_change_label(self.action)


class Profile(models.Model):
    """A user's own settings, whatever the workspace. `language` is blank for users who never chose: their browser's
    Accept-Language decides."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    language = models.CharField(max_length=16, blank=True, choices=settings.LANGUAGES)
