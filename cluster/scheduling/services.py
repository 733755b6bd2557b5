"""What people change in the pool, and the checks on what a job asks of it: priority classes by role, requests the
pool can hold, quotas set by platform administrators (a change never stops running work: what a workspace holds
beyond a lowered quota is reclaimed by preemption, at checkpoints, when others need it)."""

from django.db import transaction
from django.db.models import Sum
from django.utils.translation import gettext as _

from accounts.errors import ValidationFailed
from accounts.models import Role, Workspace, capped_by_key, rank_of
from accounts.services import Actor, is_platform_admin, record_audit, require_platform_admin, role_of
from cluster.models import DeviceQuota, PriorityClass, Workload, WorkloadState
from cluster.scheduling import pool
from cluster.scheduling.pool import DeviceRequest

# The least role that may submit work in each class; platform administrators may use any.
PRIORITY_ROLES = {PriorityClass.LOW: Role.DEVELOPER, PriorityClass.NORMAL: Role.DEVELOPER,
                  PriorityClass.HIGH: Role.ADMIN, PriorityClass.URGENT: Role.OWNER}


def allowed_priorities(*, actor: Actor, workspace: Workspace) -> list[str]:
    if is_platform_admin(actor) or actor.user is None:
        return list(PRIORITY_ROLES)
    held = capped_by_key(role_of(user=actor.user, workspace=workspace), actor.api_key)
    return [name for name, role in PRIORITY_ROLES.items() if rank_of(held) >= rank_of(role)]


def check_request(*, actor: Actor, workspace: Workspace, request: DeviceRequest) -> None:
    """ValidationFailed (400) naming the problem: an unknown class or one the caller's role may not use, a size
    range that makes no sense, or more devices of the kind than the pool (or the job's nodes) has."""
    if request.priority not in PRIORITY_ROLES:
        raise ValidationFailed(_("Unknown priority class '%(priority)s'; use %(classes)s.")
                               % {"priority": request.priority, "classes": ", ".join(PRIORITY_ROLES)},
                               fields={"priority": ["Unknown class."]})
    allowed = allowed_priorities(actor=actor, workspace=workspace)
    if request.priority not in allowed:
        raise ValidationFailed(_("The %(priority)s class needs the %(role)s role in this workspace; you may use "
                                 "%(allowed)s.") % {"priority": request.priority,
                                                    "role": PRIORITY_ROLES[request.priority],
                                                    "allowed": ", ".join(allowed) or _("none")},
                               fields={"priority": ["Not allowed for your role."]})
    if not 1 <= request.min_devices <= request.max_devices:
        raise ValidationFailed(_("A job asks for min to max devices, with 1 <= min <= max (got %(low)s to "
                                 "%(high)s).") % {"low": request.min_devices, "high": request.max_devices},
                               fields={"devices": ["1 <= min <= max."]})
    capacity = pool.capacity()
    nodes = [node for node in capacity if not request.nodes or node in request.nodes]
    counts = [capacity[node].get(request.device_kind, 0) for node in nodes]
    room = sum(counts) if request.spread else max(counts, default=0)
    if request.max_devices > room:
        where = _("node %(nodes)s") % {"nodes": ", ".join(request.nodes)} if request.nodes else _("the pool")
        raise ValidationFailed(
            _("This job asks for up to %(asked)s %(kind)s, and %(where)s has %(room)s%(single)s.")
            % {"asked": request.max_devices, "kind": request.device_kind, "where": where, "room": room,
               "single": "" if request.spread else _(" on one node")},
            fields={"devices": [f"At most {room}."]})


def running_devices(*, workspace: Workspace, device_kind: str) -> int:
    held = Workload.objects.filter(job__workspace=workspace, device_kind=device_kind).exclude(
        state__in=[WorkloadState.WAITING, WorkloadState.FINISHED])
    return sum(workload.devices for workload in held)


@transaction.atomic
def set_quota(*, actor: Actor, workspace: Workspace, device_kind: str, nominal: int,
              borrowing_limit: int | None = None, lending_limit: int | None = None) -> DeviceQuota:
    """Set a workspace's queue for a device kind. Refused: a kind the pool does not have, nominal quotas over the
    pool's devices of the kind, or a quota with its borrowing limit below what the workspace runs now."""
    require_platform_admin(actor=actor, action=_("Setting the pool's quotas"))
    total = sum(kinds.get(device_kind, 0) for kinds in pool.capacity().values())
    if not total:
        kinds = sorted({kind for kinds in pool.capacity().values() for kind in kinds})
        raise ValidationFailed(_("The pool has no devices of kind '%(kind)s'; its kinds: %(kinds)s.")
                               % {"kind": device_kind, "kinds": ", ".join(kinds)},
                               fields={"device_kind": ["Unknown kind."]})
    if any(count is not None and count < 0 for count in (nominal, borrowing_limit, lending_limit)):
        raise ValidationFailed(_("Quotas and limits are device counts, 0 or more."),
                               fields={"nominal": ["0 or more."]})
    others = DeviceQuota.objects.filter(device_kind=device_kind).exclude(workspace=workspace).aggregate(
        sum=Sum("nominal"))["sum"] or 0
    if others + nominal > total:
        raise ValidationFailed(_("Nominal quotas for %(kind)s would add up to %(sum)s, and the pool has "
                                 "%(total)s; %(room)s are left to guarantee.")
                               % {"kind": device_kind, "sum": others + nominal, "total": total,
                                  "room": max(0, total - others)},
                               fields={"nominal": [f"At most {max(0, total - others)}."]})
    running = running_devices(workspace=workspace, device_kind=device_kind)
    if borrowing_limit is not None and nominal + borrowing_limit < running:
        raise ValidationFailed(_("Workspace '%(workspace)s' runs %(running)s %(kind)s now, above the quota plus "
                                 "borrowing limit of %(limit)s; raise the borrowing limit (or leave it open), and "
                                 "lower it once that work is done.")
                               % {"workspace": workspace.slug, "running": running, "kind": device_kind,
                                  "limit": nominal + borrowing_limit},
                               fields={"borrowing_limit": [f"At least {max(0, running - nominal)} now."]})
    quota, _created = DeviceQuota.objects.update_or_create(
        workspace=workspace, device_kind=device_kind,
        defaults={"nominal": nominal, "borrowing_limit": borrowing_limit, "lending_limit": lending_limit})
    record_audit(actor=actor, workspace=workspace, action="pool.quota", target=quota,
                 detail={"device_kind": device_kind, "nominal": nominal, "borrowing_limit": borrowing_limit,
                         "lending_limit": lending_limit})
    transaction.on_commit(pool.schedule_now)
    return quota
