from django.db import IntegrityError, transaction

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from workbridge.egress import EgressRefused, check_entry
from workbridge.models import EgressRule


@transaction.atomic
def add_egress_rule(*, actor: Actor, workspace: Workspace, entry: str, note: str = "") -> EgressRule:
    require_role(actor=actor, workspace=workspace, role=Role.ADMIN)
    try:
        entry = check_entry(entry)
    except EgressRefused as exc:
        raise ValidationFailed(str(exc), fields={"entry": [str(exc)]})
    try:
        with transaction.atomic():
            rule = EgressRule.objects.create(workspace=workspace, entry=entry, note=note[:200],
                                             created_by=actor.user)
    except IntegrityError:
        raise Conflict(f"'{entry}' is already on this workspace's allowlist.")
    record_audit(actor=actor, workspace=workspace, action="egress_rule.add", target=rule, detail={"entry": entry})
    return rule


@transaction.atomic
def remove_egress_rule(*, actor: Actor, rule: EgressRule) -> None:
    require_role(actor=actor, workspace=rule.workspace, role=Role.ADMIN)
    record_audit(actor=actor, workspace=rule.workspace, action="egress_rule.remove", target=rule,
                 detail={"entry": rule.entry})
    rule.delete()
