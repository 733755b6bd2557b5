from django.db.models import Count, QuerySet, Sum

from cluster.models import Job, Node


def nodes() -> QuerySet[Node]:
    return Node.objects.prefetch_related("devices")


def pool_summary() -> dict:
    totals = Node.objects.aggregate(nodes=Count("id"), cpu_cores=Sum("cpu_cores"), memory_bytes=Sum("memory_bytes"))
    gpus = Node.objects.aggregate(gpus=Count("devices"), gpu_memory_bytes=Sum("devices__memory_bytes"))
    healthy = Node.objects.filter(status="healthy").count()
    return {**{k: v or 0 for k, v in totals.items()}, **{k: v or 0 for k, v in gpus.items()}, "healthy": healthy}


def jobs_for(*, workspace) -> QuerySet[Job]:
    return Job.objects.filter(workspace=workspace).select_related("node")
