from celery import shared_task
from django.conf import settings
from django.utils import timezone

from agent_studio import evaluation, runner
from agent_studio.models import AgentRun
from agent_studio.runs import leases
from agent_studio.runs.fields import RunStatus


@shared_task(bind=True, acks_late=True)
def execute_run(self, run_id: int, resume=None) -> None:
    """Run (or continue) one agent run; a second delivery of the same run finds it leased or finished."""
    runner.execute(run_id, owner=leases.owner_id(self.request.id), resume=resume)


@shared_task
def resume_stalled_runs() -> int:
    """Runs whose worker stopped renewing their lease continue from their last checkpoint elsewhere."""
    stalled = list(AgentRun.objects.filter(status=RunStatus.RUNNING, lease_until__lt=timezone.now())
                   .values_list("pk", flat=True))
    for run_id in stalled:
        execute_run.apply_async(args=[run_id], queue=settings.AGENT_QUEUE)
    return len(stalled)


@shared_task(bind=True, acks_late=True)
def run_evaluation(self, evaluation_id: int) -> None:
    evaluation.run(evaluation_id)
