from datetime import timedelta

from django.db.models import Q, QuerySet
from django.utils import timezone

from serving.engines.base import engine
from serving.models import Deployment, Model, RequestRecord, ServingState


def models_visible_to(*, workspace) -> QuerySet[Model]:
    return Model.objects.filter(Q(workspace=workspace) | Q(workspace__isnull=True))


def deployments_visible_to(*, workspace) -> QuerySet[Deployment]:
    return Deployment.objects.filter(Q(workspace=workspace) | Q(workspace__isnull=True)).select_related(
        "model").prefetch_related("replicas__node")


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def metrics_summary(*, deployment: Deployment, minutes: int = 60, buckets: int = 12) -> dict:
    """p50/p90/p99 of TTFT, TPOT and E2E plus output tokens/s, overall and per time bucket, for the charts."""
    since = timezone.now() - timedelta(minutes=minutes)
    rows = list(RequestRecord.objects.filter(deployment=deployment, created_at__gte=since).values(
        "created_at", "status", "ttft_ms", "tpot_ms", "e2e_ms", "output_tokens").order_by("created_at"))

    def figures(batch: list[dict]) -> dict:
        out = {"requests": len(batch), "errors": sum(1 for r in batch if r["status"] >= 400)}
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            values = [r[name] for r in batch if r[name] is not None]
            for share in (0.5, 0.9, 0.99):
                out[f"{name.removesuffix('_ms')}_p{int(share * 100)}_ms"] = _percentile(values, share)
        decode_s = sum((r["e2e_ms"] - r["ttft_ms"]) / 1000 for r in batch
                       if r["e2e_ms"] is not None and r["ttft_ms"] is not None)
        tokens = sum(r["output_tokens"] or 0 for r in batch)
        out["output_tokens"] = tokens
        out["tokens_per_s"] = tokens / decode_s if decode_s > 0 else None
        return out

    width = timedelta(minutes=minutes) / buckets
    series = []
    for index in range(buckets):
        start = since + width * index
        batch = [r for r in rows if start <= r["created_at"] < start + width]
        series.append({"start": start.isoformat(), **figures(batch)})
    return {"deployment": deployment.name, "minutes": minutes, "overall": figures(rows), "series": series}


def engine_stats(*, deployment: Deployment) -> dict[int, dict]:
    """Each ready replica's own report of its load, by replica id (asked live; an engine that reports nothing, or a
    replica that does not answer in time, gets no figures or an error)."""
    adapter = engine(deployment.engine)
    stats = {}
    for replica in deployment.replicas.all():
        if replica.state == ServingState.READY and replica.base_url:
            reported = adapter.live_stats(replica.base_url, replica.api_key)
            if reported is not None:
                stats[replica.pk] = reported
    return stats
