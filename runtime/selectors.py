from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.utils import timezone

from accounts.errors import NotFound
from accounts.models import Workspace
from rag_studio.models import EvalRun, JobStatus
from runtime.models import App, Trace, TraceStatus
from serving.metrics import percentile

PERIODS = {"1h": (timedelta(hours=1), timedelta(minutes=5)), "24h": (timedelta(hours=24), timedelta(hours=1)),
           "7d": (timedelta(days=7), timedelta(hours=6)), "30d": (timedelta(days=30), timedelta(days=1))}


def apps(*, workspace: Workspace):
    return (App.objects.filter(workspace=workspace)
            .select_related("rag_config", "agent", "workflow", "current_release__config_version",
                            "current_release__agent_version", "current_release__workflow_version")
            .annotate(calls=Count("traces")))


def app_cards(*, workspace: Workspace, hours: int = 24):
    """The workspace's apps with their calls and errors of the last `hours`, for the home page's cards."""
    since = timezone.now() - timedelta(hours=hours)
    recent = Q(traces__created_at__gte=since) & ~Q(traces__channel="retrieve")
    return (App.objects.filter(workspace=workspace).select_related("rag_config", "agent", "workflow",
                                                                   "current_release")
            .annotate(recent_calls=Count("traces", filter=recent),
                      recent_errors=Count("traces", filter=recent & Q(traces__status=TraceStatus.ERROR))))


def app_by_slug(*, workspace: Workspace, slug: str) -> App:
    app = apps(workspace=workspace).filter(slug=slug).first()
    if app is None:
        raise NotFound(f"App '{slug}' not found in this workspace.")
    return app


def traces(*, app: App, since: datetime | None = None, until: datetime | None = None, feedback: str = "",
           status: str = ""):
    """The app's calls, newest first. feedback: up, down, any or none; status: ok, error or cancelled."""
    found = Trace.objects.filter(app=app).select_related("feedback", "release", "workflow_run")
    if since:
        found = found.filter(created_at__gte=since)
    if until:
        found = found.filter(created_at__lt=until)
    if feedback in ("up", "down"):
        found = found.filter(feedback__rating=1 if feedback == "up" else -1)
    elif feedback == "any":
        found = found.filter(feedback__isnull=False)
    elif feedback == "none":
        found = found.filter(feedback__isnull=True)
    if status in TraceStatus.values:
        found = found.filter(status=status)
    return found


def _percentile(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value, 1)


def latest_eval(app: App) -> EvalRun | None:
    """The newest finished eval run of the config version the app serves now."""
    if app.current_release is None or app.is_agent or app.is_workflow:
        return None
    return (EvalRun.objects.filter(config_version_id=app.current_release.config_version_id, status=JobStatus.DONE)
            .select_related("eval_set").first())


HEADLINE_METRICS = ("hit@k", "mrr", "token_f1", "faithfulness")


def eval_headline(run: EvalRun | None) -> list[tuple[str, float]]:
    return [(name, run.metrics[name]["mean"]) for name in HEADLINE_METRICS if run and name in run.metrics]


def eval_history(app: App, since: datetime) -> list[dict]:
    """Finished eval runs of every config version the app has served, oldest first: how quality moved across
    releases."""
    runs = (EvalRun.objects.filter(config_version__releases__app=app, status=JobStatus.DONE,
                                   finished_at__gte=since).distinct()
            .select_related("config_version").order_by("finished_at"))
    return [{"at": run.finished_at.isoformat(), "run_id": run.pk, "config_version": run.config_version.number,
             **{name: value for name, value in eval_headline(run)}} for run in runs]


def monitoring(*, app: App, period: str = "24h") -> dict:
    """Per time bucket: requests, error rate, p50/p95 latency and TTFT, feedback up/down; plus the totals and
    the latest eval score of the pinned config version. Percentiles are computed here because SQLite has no
    percentile aggregate; a bucket holds one period's calls of one app, which fits in memory."""
    span, step = PERIODS.get(period, PERIODS["24h"])
    now = timezone.now()
    start = now - span
    rows = (Trace.objects.filter(app=app, created_at__gte=start).exclude(channel="retrieve")
            .values_list("created_at", "status", "latency_ms", "ttft_ms", "feedback__rating"))
    count = int(span / step)
    buckets = [{"at": (start + step * i).isoformat(), "requests": 0, "errors": 0, "latency": [], "ttft": [],
                "up": 0, "down": 0} for i in range(count)]
    for created_at, status, latency, ttft, rating in rows:
        bucket = buckets[min(count - 1, int((created_at - start) / step))]
        bucket["requests"] += 1
        bucket["errors"] += status == TraceStatus.ERROR
        if status == TraceStatus.OK:
            bucket["latency"] += [latency] if latency is not None else []
            bucket["ttft"] += [ttft] if ttft is not None else []
        bucket["up"] += rating == 1
        bucket["down"] += rating == -1
    series = []
    for bucket in buckets:
        latency, ttft, votes = bucket.pop("latency"), bucket.pop("ttft"), bucket["up"] + bucket["down"]
        series.append({**bucket,
                       "error_rate": round(bucket["errors"] / bucket["requests"], 3) if bucket["requests"] else None,
                       "latency_p50": _percentile(latency, 50), "latency_p95": _percentile(latency, 95),
                       "ttft_p50": _percentile(ttft, 50), "ttft_p95": _percentile(ttft, 95),
                       "feedback_ratio": round(bucket["up"] / votes, 3) if votes else None})
    totals = Trace.objects.filter(app=app, created_at__gte=start).exclude(channel="retrieve").aggregate(
        requests=Count("id"), errors=Count("id", filter=Q(status=TraceStatus.ERROR)),
        up=Count("id", filter=Q(feedback__rating=1)), down=Count("id", filter=Q(feedback__rating=-1)))
    run = latest_eval(app)
    return {"period": period if period in PERIODS else "24h", "step_seconds": int(step.total_seconds()),
            "series": series, "totals": totals, "eval_history": eval_history(app, start),
            "eval": {"run_id": run.pk, "eval_set": run.eval_set.name, "headline": dict(eval_headline(run)),
                     "finished_at": run.finished_at.isoformat() if run.finished_at else None} if run else None}
