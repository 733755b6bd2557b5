from celery import shared_task
from django.utils import timezone

from agent_studio.runs.fields import RunStatus
from agent_studio.runs.leases import owner_id
from agent_studio.workflows import evaluation, runner
from agent_studio.workflows.models import WorkflowRun
from cluster import queues


@shared_task(bind=True, acks_late=True)
def execute_workflow_run(self, run_id: int) -> None:
    """Run (or go on with) one workflow run; a second delivery finds it leased or finished."""
    runner.execute(run_id, owner=owner_id(self.request.id))


@shared_task
def resume_stalled_workflow_runs() -> int:
    """Runs whose worker stopped renewing their lease go on elsewhere, after the nodes they had finished."""
    stalled = list(WorkflowRun.objects.filter(status=RunStatus.RUNNING, lease_until__lt=timezone.now())
                   .values_list("pk", "workspace_id"))
    for run_id, workspace_id in stalled:
        queues.send(execute_workflow_run.name, [run_id], queue=queues.INTERACTIVE, workspace_id=workspace_id)
    return len(stalled)


@shared_task(bind=True, acks_late=True)
def run_workflow_evaluation(self, evaluation_id: int) -> None:
    evaluation.run(evaluation_id)
