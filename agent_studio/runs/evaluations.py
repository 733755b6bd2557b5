"""Queueing and stopping evaluations, an agent's and a workflow's alike: they run in the interactive line
(cluster/queues.py), one task message each, which says whose it is."""

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.errors import Conflict
from accounts.models import Role
from accounts.services import Actor, record_audit, require_role
from agent_studio.runs.fields import EvalRunFields, EvalStatus
from cluster import queues


def queue(model: type[EvalRunFields], task_name: str, *, workspace_id: int, **fields) -> EvalRunFields:
    """Create an evaluation (an agent's or a workflow's) and send it to the interactive line once it is committed,
    to the task `task_name`."""
    evaluation = model.objects.create(**fields)
    transaction.on_commit(lambda: queues.send(task_name, [evaluation.pk], queue=queues.INTERACTIVE,
                                              workspace_id=workspace_id))
    return evaluation


def stop(*, actor: Actor, evaluation: EvalRunFields, subject, task_name: str, audit_action: str) -> EvalRunFields:
    """Stop an evaluation of `subject` (an agent or a workflow): a queued one leaves the line at once, a running
    one stops before its next scenario or probe; the results so far are kept."""
    require_role(actor=actor, workspace=subject.workspace, role=Role.DEVELOPER)
    if not type(evaluation).objects.filter(pk=evaluation.pk, status__in=[EvalStatus.QUEUED, EvalStatus.RUNNING]) \
            .update(status=EvalStatus.CANCELLED, finished_at=timezone.now()):
        raise Conflict(_("Evaluation %(id)s is %(status)s; only a queued or running one can be cancelled.")
                       % {"id": evaluation.pk, "status": evaluation.status})
    queues.withdraw(queues.INTERACTIVE, task_name, [evaluation.pk])
    record_audit(actor=actor, workspace=subject.workspace, action=audit_action, target=subject,
                 detail={"evaluation": evaluation.pk})
    evaluation.refresh_from_db()
    return evaluation
