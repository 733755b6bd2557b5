"""The cluster job kind that runs enhancement jobs on their node's worker (registered when the app loads)."""

from cluster.jobs import job_handler
from enhancement import runner
from enhancement.models import EnhancementJob

RUN_KIND = "enhancement.run"


@job_handler(RUN_KIND)
def run_enhancement_job(job, report) -> dict:
    enhancement_job = EnhancementJob.objects.select_related("base_model").get(pk=job.payload["enhancement_job_id"])
    return runner.supervise(enhancement_job, report)
