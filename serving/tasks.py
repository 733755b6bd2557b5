from celery import shared_task

from cluster import queues
from cluster.models import Node
from serving import services

# Calibration is interactive work (cluster/queues.py): its own worker process, so neither bulk ingestion nor the
# node's replica jobs hold it up, nor it them.
CALIBRATION_QUEUE = queues.INTERACTIVE


@shared_task(name="serving.tasks.check_local_replicas", ignore_result=True)
def check_local_replicas() -> list[str]:
    return services.check_local_replicas()


@shared_task(name="serving.tasks.check_replicas", ignore_result=True)
def check_replicas() -> None:
    """Beat: every node checks its own replicas, on its own queue."""
    for queue in [node.queue for node in Node.objects.filter(replicas__isnull=False).distinct()]:
        check_local_replicas.apply_async(queue=queue, expires=10)


@shared_task(name="serving.tasks.calibrate_group", ignore_result=True, acks_late=True)
def calibrate_group(run_id: int) -> None:
    """Both members of a model group answer the run's prompts; the curve is drawn at the end. A redelivered task
    goes on from the first prompt without an answer."""
    from serving.groups.calibration import calibrate

    calibrate(run_id)
