from celery import shared_task

from cluster.models import Node
from serving import services

# Calibration runs in the worker process that runs evaluations (scripts/proc.sh worker), so minutes of generation
# never hold up the replica jobs of the node's own queue.
CALIBRATION_QUEUE = "ingest"


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
