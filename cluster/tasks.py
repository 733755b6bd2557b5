from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from cluster import inventory, services
from cluster.models import Node


@shared_task(name="cluster.tasks.run_job", bind=True)
def run_job(self, job_id: int) -> str:
    return services.run_job(job_id=job_id, worker=self.request.hostname or "").state


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
