from celery import shared_task
from celery.signals import worker_ready

from rag_studio import evaluation, ingestion


@shared_task(name="rag_studio.tasks.ingest_document", bind=True, ignore_result=True)
def ingest_document(self, document_id: int) -> str:
    return ingestion.ingest(document_id, worker=self.request.hostname or "worker")


@shared_task(name="rag_studio.tasks.resume_stalled_documents", ignore_result=True)
def resume_stalled_documents() -> list[int]:
    return ingestion.resume_stalled()


@shared_task(name="rag_studio.tasks.generate_eval_set", ignore_result=True)
def generate_eval_set(eval_set_id: int) -> None:
    evaluation.generate_items(eval_set_id)


@shared_task(name="rag_studio.tasks.run_eval", ignore_result=True)
def run_eval(run_id: int) -> None:
    evaluation.execute_run(run_id)


@worker_ready.connect
def resume_on_start(**_kwargs) -> None:
    """A worker that starts after a crash picks up what the crashed one left behind."""
    ingestion.resume_stalled()
