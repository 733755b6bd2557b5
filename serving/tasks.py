from celery import shared_task

from cluster.models import Node
from serving import services


@shared_task(name="serving.tasks.check_local_replicas", ignore_result=True)
def check_local_replicas() -> list[str]:
    return services.check_local_replicas()


@shared_task(name="serving.tasks.check_replicas", ignore_result=True)
def check_replicas() -> None:
    """Beat: every node checks its own replicas, on its own queue."""
    for queue in [node.queue for node in Node.objects.filter(replicas__isnull=False).distinct()]:
        check_local_replicas.apply_async(queue=queue, expires=10)
