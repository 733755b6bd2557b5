"""The cluster job kinds that run enhancement jobs, and remove a deleted job's files, on their node's worker (registered
when the app loads)."""

from pathlib import Path

from django.conf import settings
from django.dispatch import receiver

from cluster.deadlines import job_given_up
from cluster.jobs import job_handler
from enhancement import runner
from enhancement.models import EnhancementJob
from serving.engines import process

RUN_KIND = "enhancement.run"
# Removes a deleted job's run directory on the node that holds it.
REMOVE_FILES_KIND = "enhancement.remove_files"


@job_handler(RUN_KIND)
def run_enhancement_job(job, report) -> dict:
    enhancement_job = EnhancementJob.objects.select_related("base_model").get(pk=job.payload["enhancement_job_id"])
    try:
        return runner.supervise(enhancement_job, report)
    except Exception as exc:
        runner.record_failure(enhancement_job, exc)
        raise


@job_handler(REMOVE_FILES_KIND)
def remove_job_files(job, report) -> dict:
    return {"freed_bytes": runner.remove_run_dir(Path(job.payload["run_dir"]))}


@receiver(job_given_up)
def _run_given_up(sender, job, reason: str, **_kwargs) -> None:
    """Beat gave up on the job (its node unhealthy, or its worker dead too often): the job shows the reason, and
    on this node its process is stopped rather than left training for nobody."""
    if job.kind != RUN_KIND:
        return
    enhancement_job = EnhancementJob.objects.filter(pk=job.payload.get("enhancement_job_id")).first()
    if enhancement_job is None:
        return
    EnhancementJob.objects.filter(pk=enhancement_job.pk).update(error=reason)
    if enhancement_job.node.name == settings.NODE_NAME and runner.is_running(enhancement_job):
        process.terminate(enhancement_job.pid)
