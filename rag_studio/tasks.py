"""Thin Celery tasks. Each names its lease owner after this process and this task (`leases.owner_name`); time limits,
queues and the beat schedule are set in factory/celery.py."""

from celery import shared_task
from celery.signals import worker_ready

from cluster.leases import owner_name
from rag_studio.evals import adaptive, evaluation, jobs, tuning
from rag_studio.models import JobStatus
from rag_studio.pipeline import ingestion


@shared_task(name="rag_studio.tasks.ingest_next", bind=True, ignore_result=True)
def ingest_next(self) -> str:
    return ingestion.ingest_next(worker=owner_name(self.request.hostname, self.request.id))


# One document, as messages sent before the ingestion line existed ask (an upgrade may find some in Redis); the
# live tests send it to a worker they are about to kill.
@shared_task(name="rag_studio.tasks.ingest_document", bind=True, ignore_result=True)
def ingest_document(self, document_id: int) -> str:
    return ingestion.ingest(document_id, worker=owner_name(self.request.hostname, self.request.id))


@shared_task(name="rag_studio.tasks.resume_stalled_documents", ignore_result=True)
def resume_stalled_documents() -> list[int]:
    return ingestion.resume_stalled()


@shared_task(name="rag_studio.tasks.sweep_overdue_evaluations", ignore_result=True)
def sweep_overdue_evaluations() -> dict[str, list[int]]:
    return jobs.sweep_overdue()


@shared_task(name="rag_studio.tasks.generate_eval_set", bind=True, ignore_result=True)
def generate_eval_set(self, eval_set_id: int) -> str:
    return evaluation.generate_items(eval_set_id, owner_name(self.request.hostname, self.request.id))


@shared_task(name="rag_studio.tasks.run_eval", bind=True, ignore_result=True)
def run_eval(self, run_id: int) -> str:
    return evaluation.execute_run(run_id, owner_name(self.request.hostname, self.request.id))


@shared_task(name="rag_studio.tasks.tune_retrieval", bind=True, ignore_result=True)
def tune_retrieval(self, tuning_id: int) -> str:
    status = tuning.execute_tuning(tuning_id, owner_name(self.request.hostname, self.request.id))
    if status == JobStatus.DONE:
        adaptive.adopt(tuning_id)  # an automatic job's winner becomes the default where it earned it
    return status


@shared_task(name=jobs.ADAPT_TASK, ignore_result=True)
def adapt_retrieval(kb_id: int) -> int | None:
    job = adaptive.consider(kb_id)
    return job.pk if job else None


@worker_ready.connect
def resume_on_start(**_kwargs) -> None:
    """A worker that starts after a crash picks up what the crashed one left behind."""
    ingestion.resume_stalled()
