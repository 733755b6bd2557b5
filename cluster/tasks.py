import os

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from cluster import deadlines, inventory, services
from cluster.models import Node
from cluster.scheduling import pool


@shared_task(name="cluster.tasks.run_job", bind=True)
def run_job(self, job_id: int) -> str:
    """Run the job unless a live worker already runs it (a second message for it: beat sends one again when the
    first seems lost); a heartbeat in the cache tells beat this worker is alive while it runs."""
    heartbeat = deadlines.JobHeartbeat(job_id, f"{self.request.hostname}/{os.getpid()}/{self.request.id}")
    if not heartbeat.claim():
        return "running elsewhere"
    with heartbeat:
        return services.run_job(job_id=job_id, worker=self.request.hostname or "").state


@shared_task(name="cluster.tasks.sweep_overdue_jobs", ignore_result=True)
def sweep_overdue_jobs() -> dict[str, list[int]]:
    return deadlines.sweep_overdue_jobs()


@shared_task(name="cluster.tasks.schedule_pool", ignore_result=True)
def schedule_pool() -> None:
    """Beat's tick of the pool's scheduler (each submit and job end runs a pass too)."""
    pool.schedule_now()


@shared_task(name="cluster.tasks.heartbeat", ignore_result=True)
def heartbeat() -> None:
    services.record_heartbeat(name=settings.NODE_NAME, resources=inventory.probe())


@shared_task(name="cluster.tasks.request_heartbeats", ignore_result=True)
def request_heartbeats() -> None:
    """Ask every node's worker for a heartbeat on its own queue, then mark those that stopped answering."""
    for queue in [node.queue for node in Node.objects.all()]:
        heartbeat.apply_async(queue=queue, expires=settings.NODE_HEARTBEAT_INTERVAL_S)
    services.mark_stale_nodes(timeout_s=settings.NODE_HEARTBEAT_TIMEOUT_S)


@worker_ready.connect
def join_pool(**_kwargs) -> None:
    """A worker that starts on a new machine puts that machine in the pool."""
    services.register_local_node()
