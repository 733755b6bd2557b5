import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Model
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from accounts import deferred_writes, ratelimits
from accounts.errors import Conflict, Forbidden, NotFound, RateLimited, Unauthenticated, ValidationFailed
from accounts.models import (
    ROLE_RANK,
    ApiKey,
    AuditEntry,
    KeyScope,
    Membership,
    Profile,
    Role,
    Workspace,
    capped_by_key,
    rank_of,
)

User = get_user_model()
API_KEY_PREFIX = "afk_"


@dataclass(frozen=True)
class Actor:
    """Who is doing something: a user, possibly through one of their API keys, from an address."""

    user: User | None
    api_key: ApiKey | None = None
    ip: str | None = None


SYSTEM = Actor(user=None)


def record_audit(*, actor: Actor, workspace: Workspace | None, action: str, target: Model | None = None,
                 detail: dict | None = None) -> AuditEntry:
    return AuditEntry.objects.create(
        workspace=workspace,
        actor=actor.user,
        api_key=actor.api_key,
        action=action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        detail=detail or {},
        ip=actor.ip,
    )


def role_of(*, user: User, workspace: Workspace) -> str | None:
    membership = Membership.objects.filter(user=user, workspace=workspace).only("role").first()
    return membership.role if membership else None


def require_role(*, actor: Actor, workspace: Workspace, role: str) -> None:
    """Raise unless the actor holds at least `role` in the workspace (an API key is capped by its own role)."""
    held = role_of(user=actor.user, workspace=workspace) if actor.user else None
    if held is None:
        raise NotFound(_("Workspace not found."))
    held = capped_by_key(held, actor.api_key)
    if rank_of(held) < ROLE_RANK[role]:
        raise Forbidden(_("This needs the %(role)s role in workspace '%(workspace)s'; you are %(held)s.")
                        % {"role": role, "workspace": workspace.slug, "held": held})


def is_platform_admin(actor: Actor) -> bool:
    """A platform administrator is an active staff user acting in a signed-in session, or through a key made with the
    platform scope. A staff user's ordinary workspace key gets the workspace's powers, nothing more: a key meant for
    one app's backend must never stop what every tenant shares."""
    user = actor.user
    if user is None or not (user.is_staff and user.is_active):
        return False
    return actor.api_key is None or actor.api_key.scope == KeyScope.PLATFORM


def require_platform_admin(*, actor: Actor, action: str) -> None:
    """Shared things (preset models and their deployments, model files on the server) are changed by platform
    administrators only; the platform itself (no user: bootstrap, presets) may too. Every use of a platform key is
    audited, whatever the action."""
    if actor.user is None:
        return
    if not is_platform_admin(actor):
        raise Forbidden(_("%(action)s is a platform administrator's action; ask one of them.") % {"action": action})
    if actor.api_key is not None:
        record_audit(actor=actor, workspace=actor.api_key.workspace, action="platform_key.use",
                     target=actor.api_key, detail={"action": action})


def require_role_or_platform(*, actor: Actor, workspace: Workspace | None, role: str, action: str) -> None:
    """`role` in the workspace; for a shared thing (no workspace), a platform administrator. The platform itself
    (no user) passes."""
    if actor.user is None:
        return
    if workspace is None:
        require_platform_admin(actor=actor, action=action)
    else:
        require_role(actor=actor, workspace=workspace, role=role)


def _check_role(role: str, field: str = "role") -> None:
    if role not in Role.values:
        raise ValidationFailed(_("'%(role)s' is not a role; roles are %(values)s.")
                               % {"role": role, "values": ', '.join(Role.values)},
                               fields={field: [f"One of {', '.join(Role.values)}."]})


def _unique_slug(name: str) -> str:
    base = slugify(name)[:48] or "workspace"
    slug, n = base, 2
    while Workspace.objects.filter(slug=slug).exists():
        slug, n = f"{base}-{n}", n + 1
    return slug


def choose_language(*, user: User, language: str) -> Profile:
    """Remember the user's GUI language across sessions and browsers."""
    if language not in dict(settings.LANGUAGES):
        raise ValidationFailed(_("Unknown language '%(language)s'.") % {"language": language},
                               fields={"language": [_("Unknown language.")]})
    profile, _created = Profile.objects.update_or_create(user=user, defaults={"language": language})
    return profile


def chosen_language(*, user: User) -> str:
    return Profile.objects.filter(user=user).values_list("language", flat=True).first() or ""


def may_create_workspaces(user) -> bool:
    """FACTORY_WORKSPACE_CREATION: `staff` (the default: an enterprise's administrators hand out workspaces) or
    `anyone` signed in."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return settings.WORKSPACE_CREATION == "anyone" or user.is_staff


@transaction.atomic
def create_workspace(*, actor: Actor, name: str) -> Workspace:
    if actor.api_key is not None or not may_create_workspaces(actor.user):
        raise Forbidden(_("Only platform administrators create workspaces here (FACTORY_WORKSPACE_CREATION=staff); "
                          "ask one to create one for you or to add you to theirs."))
    name = name.strip()
    if not name:
        raise ValidationFailed(_("A workspace needs a name."), fields={"name": [_("This field may not be blank.")]})
    workspace = Workspace.objects.create(name=name, slug=_unique_slug(name))
    Membership.objects.create(workspace=workspace, user=actor.user, role=Role.OWNER)
    record_audit(actor=actor, workspace=workspace, action="workspace.create", target=workspace)
    return workspace


@transaction.atomic
def add_member(*, actor: Actor, workspace: Workspace, username: str, role: str) -> Membership:
    require_role(actor=actor, workspace=workspace, role=Role.ADMIN)
    _check_role(role)
    if role == Role.OWNER:
        require_role(actor=actor, workspace=workspace, role=Role.OWNER)
    user = User.objects.filter(username=username).first()
    if user is None:
        raise ValidationFailed(_("No user is called '%(username)s'.") % {"username": username},
                               fields={"username": [_("Unknown user.")]})
    try:
        with transaction.atomic():
            membership = Membership.objects.create(workspace=workspace, user=user, role=role)
    except IntegrityError:
        raise Conflict(_("'%(username)s' is already a member of this workspace.") % {"username": username})
    record_audit(actor=actor, workspace=workspace, action="member.add", target=membership,
                 detail={"username": username, "role": role})
    return membership


def _ensure_an_owner_remains(membership: Membership) -> None:
    if membership.role == Role.OWNER and not (
        Membership.objects.filter(workspace=membership.workspace, role=Role.OWNER).exclude(pk=membership.pk).exists()
    ):
        raise Conflict(_("A workspace must keep at least one owner."))


@transaction.atomic
def change_member_role(*, actor: Actor, membership: Membership, role: str) -> Membership:
    require_role(actor=actor, workspace=membership.workspace, role=Role.ADMIN)
    _check_role(role)
    if Role.OWNER in (role, membership.role):
        require_role(actor=actor, workspace=membership.workspace, role=Role.OWNER)
    if role != Role.OWNER:
        _ensure_an_owner_remains(membership)
    old = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    record_audit(actor=actor, workspace=membership.workspace, action="member.role", target=membership,
                 detail={"from": old, "to": role})
    return membership


@transaction.atomic
def remove_member(*, actor: Actor, membership: Membership) -> None:
    """Remove a member, and revoke every API key they made in this workspace: a key acts as its maker, who is no
    longer here."""
    require_role(actor=actor, workspace=membership.workspace, role=Role.ADMIN)
    _ensure_an_owner_remains(membership)
    revoked = ApiKey.objects.filter(workspace=membership.workspace, created_by=membership.user,
                                    revoked_at__isnull=True).update(revoked_at=timezone.now())
    record_audit(actor=actor, workspace=membership.workspace, action="member.remove", target=membership,
                 detail={"username": membership.user.username, "keys_revoked": revoked})
    membership.delete()


def check_sign_in_allowed(*, username: str, ip: str | None) -> None:
    """Refuse (429) a sign-in for a name or from an address that failed too often lately (FACTORY_LOGIN_RATE)."""
    from django.conf import settings

    ratelimits.check(settings.LOGIN_RATE, "login-user", username.lower()[:150], what="this user name")
    ratelimits.check(settings.LOGIN_RATE, "login-ip", ip or "unknown", what="this address")


def record_failed_sign_in(*, username: str, ip: str | None) -> None:
    from django.conf import settings

    for scope, value in (("login-user", username.lower()[:150]), ("login-ip", ip or "unknown")):
        try:
            ratelimits.hit(settings.LOGIN_RATE, scope, value, what="sign-in")
        except RateLimited:
            pass  # already counted past the limit: the next attempt is refused


def hash_secret(raw: str) -> str:
    # Issued secrets carry 256 bits of randomness, so a plain SHA-256 is as strong as a slow password hash here.
    return hashlib.sha256(raw.encode()).hexdigest()


def issue_secret(tag: str) -> tuple[str, str]:
    """A new `<tag><prefix>.<secret>` credential and its prefix; the prefix finds the row, the hash checks it."""
    prefix = secrets.token_hex(6)
    return prefix, f"{tag}{prefix}.{secrets.token_urlsafe(32)}"


def secret_prefix(raw: str, tag: str) -> str | None:
    """The prefix of a credential issued with `tag`, or None when it is not one."""
    if not raw.startswith(tag) or "." not in raw:
        return None
    return raw[len(tag):].split(".", 1)[0]


def secret_matches(raw: str, key_hash: str) -> bool:
    return secrets.compare_digest(key_hash, hash_secret(raw))


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    secret: str  # shown to the user once, never stored


@transaction.atomic
def create_api_key(*, actor: Actor, workspace: Workspace, name: str, role: str = Role.DEVELOPER,
                   expires_at: datetime | None = None, scope: str = KeyScope.WORKSPACE) -> IssuedKey:
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    _check_role(role)
    if scope not in KeyScope.values:
        raise ValidationFailed(_("'%(scope)s' is not a key scope; scopes are %(values)s.")
                               % {"scope": scope, "values": ', '.join(KeyScope.values)},
                               fields={"scope": [f"One of {', '.join(KeyScope.values)}."]})
    if scope == KeyScope.PLATFORM and (actor.api_key is not None or not is_platform_admin(actor)):
        raise Forbidden(_("Only a platform administrator, signed in (not through a key), creates a platform key."))
    # A key can never hold more rights than the person who makes it.
    require_role(actor=actor, workspace=workspace, role=role)
    name = name.strip()
    if not name:
        raise ValidationFailed(_("Give the key a name so you can recognise it later."),
                               fields={"name": ["This field may not be blank."]})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("The expiry date is in the past.", fields={"expires_at": ["Must be in the future."]})
    prefix, secret = issue_secret(API_KEY_PREFIX)
    api_key = ApiKey.objects.create(workspace=workspace, created_by=actor.user, name=name, role=role, scope=scope,
                                    prefix=prefix, key_hash=hash_secret(secret), expires_at=expires_at)
    record_audit(actor=actor, workspace=workspace, action="api_key.create", target=api_key,
                 detail={"name": name, "role": role, "scope": scope})
    return IssuedKey(api_key=api_key, secret=secret)


@transaction.atomic
def revoke_api_key(*, actor: Actor, api_key: ApiKey) -> ApiKey:
    if api_key.created_by_id != getattr(actor.user, "pk", None):
        require_role(actor=actor, workspace=api_key.workspace, role=Role.ADMIN)
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        record_audit(actor=actor, workspace=api_key.workspace, action="api_key.revoke", target=api_key)
    return api_key


def authenticate_api_key(*, raw: str, stamp_later: bool = False) -> ApiKey:
    """Find the live key behind a presented secret and stamp its last use (`stamp_later`: once the request that
    presented it has its answer, for a request that must not wait on a database write)."""
    prefix = secret_prefix(raw, API_KEY_PREFIX)
    if prefix is None:
        raise Unauthenticated("That is not an AI Factory API key.")
    api_key = ApiKey.objects.select_related("workspace", "created_by").filter(prefix=prefix).first()
    if api_key is None or not secret_matches(raw, api_key.key_hash):
        raise Unauthenticated("Invalid API key.")
    now = timezone.now()
    if api_key.revoked_at is not None:
        raise Unauthenticated("This API key has been revoked.")
    if api_key.expires_at is not None and api_key.expires_at <= now:
        raise Unauthenticated("This API key has expired.")
    if not api_key.created_by.is_active:
        raise Unauthenticated("The owner of this API key is deactivated.")
    stamp_last_used(api_key, now=now, later=stamp_later)
    return api_key


LAST_USED_RESOLUTION_S = 60


def stamp_last_used(key, *, now=None, later: bool = False) -> None:
    """Record that `key` (an API key, an app key: a row with `last_used_at`) was just used, at most once a minute:
    stamping every request would write on every call, and a minute's resolution is enough to show "last used".
    `later`: written off the caller's path (accounts/deferred_writes.py)."""
    now = now or timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > LAST_USED_RESOLUTION_S:
        if later:
            deferred_writes.update(type(key), key.pk, last_used_at=now)
        else:
            type(key).objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now


SERVICE_TOKEN_PREFIX = "afs_"


def _service_signature(claim: str) -> str:
    from django.conf import settings
    from django.utils.crypto import salted_hmac

    return salted_hmac("accounts.service-token", claim, secret=settings.SECRET_KEY, algorithm="sha256").hexdigest()


def service_token(*, workspace_id: int, ttl_s: int | None = None) -> str:
    """A credential the platform's own processes use to call its APIs (the gateway, from RAG and agents) for a
    workspace: `afs_<workspace>.<expires, unix seconds>.<HMAC of both>`. Derived from the secret key, so nothing is
    stored, rotating the key revokes every token, and each stops working at its expiry."""
    from django.conf import settings

    expires = int(time.time()) + (settings.SERVICE_TOKEN_TTL_S if ttl_s is None else ttl_s)
    claim = f"{workspace_id}.{expires}"
    return f"{SERVICE_TOKEN_PREFIX}{claim}.{_service_signature(claim)}"


def authenticate_service_token(*, raw: str) -> int:
    """The workspace id a live service token acts for."""
    workspace_id, expires, signature = (raw[len(SERVICE_TOKEN_PREFIX):].split(".") + ["", "", ""])[:3]
    if not (raw.startswith(SERVICE_TOKEN_PREFIX) and workspace_id.isdigit() and expires.isdigit()
            and secrets.compare_digest(signature, _service_signature(f"{workspace_id}.{expires}"))):
        raise Unauthenticated("Invalid service token.")
    if int(expires) <= time.time():
        raise Unauthenticated("This service token has expired.")
    return int(workspace_id)


@transaction.atomic
def ensure_admin(*, username: str, password: str | None, workspace_name: str) -> tuple[User, str | None]:
    """Make the first superuser and default workspace. Returns the user and the password if one was generated."""
    user = User.objects.filter(username=username).first()
    generated = None
    if user is None:
        generated = None if password else secrets.token_urlsafe(12)
        user = User.objects.create_superuser(username=username, email="", password=password or generated)
    elif password and not user.check_password(password):
        user.set_password(password)
        user.save(update_fields=["password"])
    if not Membership.objects.filter(user=user).exists():
        workspace = Workspace.objects.filter(slug=slugify(workspace_name)).first()
        if workspace is None:
            workspace = create_workspace(actor=Actor(user=user), name=workspace_name)
        else:
            Membership.objects.create(workspace=workspace, user=user, role=Role.OWNER)
    return user, generated
