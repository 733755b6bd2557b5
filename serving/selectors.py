from datetime import timedelta

from django.db.models import Q, QuerySet
from django.utils import timezone

from cluster.models import Job, JobState
from serving.engines.base import CHAT, engine
from serving.metrics import percentile
from serving.models import (
    START_REPLICA,
    Deployment,
    GroupMember,
    GroupRequest,
    Model,
    ModelGroup,
    Replica,
    RequestRecord,
    ServingState,
)
from serving.preset_names import COMPLETION_ONLY, RECOMMENDED_CHAT


def own_or_shared(workspace) -> Q:
    """Which of serving's objects a workspace sees, the one statement of the rule: its own and the shared ones (no
    workspace: preset models and their deployments, and the requests the platform itself made through them).
    `workspace` is a Workspace or its id."""
    return Q(workspace=workspace) | Q(workspace__isnull=True)


def models_visible_to(*, workspace) -> QuerySet[Model]:
    return Model.objects.filter(own_or_shared(workspace))


def deployments_visible_to(*, workspace) -> QuerySet[Deployment]:
    return Deployment.objects.filter(own_or_shared(workspace)).select_related(
        "model").prefetch_related("replicas__node")


def groups_visible_to(*, workspace) -> QuerySet[ModelGroup]:
    return ModelGroup.objects.filter(own_or_shared(workspace)).select_related(
        "big__model", "small__model", "draft", "speculative_deployment")


def _chats(deployment: Deployment | None) -> bool:
    return deployment is not None and CHAT in engine(deployment.engine).capabilities(deployment.model)


def chat_models(*, workspace) -> list[Deployment | ModelGroup]:
    """Everything a studio may answer with: the chat deployments and the model groups (whose members chat) this
    workspace can use, by name, as the gateway takes them in `model`. The recommended instruction-tuned model comes
    first, so that forms preselect it; base (completion-only) models come last."""
    found = [d for d in deployments_visible_to(workspace=workspace) if _chats(d)]
    found += [g for g in groups_visible_to(workspace=workspace) if _group_chats(g)]
    return sorted(found, key=lambda item: (item.name != RECOMMENDED_CHAT, is_completion_only(item, COMPLETION_ONLY),
                                           item.name))


def is_completion_only(item: Deployment | ModelGroup | str, completion_only: frozenset[str]) -> bool:
    """Whether a deployment (or a group, through its big member) serves a base model, by its name or its model's."""
    if isinstance(item, ModelGroup):
        item = item.big
    if isinstance(item, Deployment):
        return item.name in completion_only or item.model.name in completion_only
    return item in completion_only


def chat_model_names(*, workspace) -> list[str]:
    return [item.name for item in chat_models(workspace=workspace)]


def _group_chats(group: ModelGroup) -> bool:
    return _chats(group.big) and (group.small is None or _chats(group.small))


def chat_model_problem(*, workspace, name: str) -> str:
    """Why `name` cannot answer chats for this workspace, in the user's words; '' when it can (a chat deployment
    or a model group)."""
    if not isinstance(name, str) or not name:
        return "Name a chat deployment or model group."
    deployment = deployments_visible_to(workspace=workspace).filter(name=name).first()
    if deployment is not None:
        return "" if _chats(deployment) else f"'{name}' cannot chat (it is an embedding or completion-only model)."
    group = groups_visible_to(workspace=workspace).filter(name=name).first()
    if group is not None:
        return "" if _group_chats(group) else f"The model group '{name}' has a member that cannot chat."
    return f"No deployment named '{name}', nor a model group. Deploy a chat model on Models & Serving first."


def group_share_summary(*, group: ModelGroup, workspace, minutes: int = 60, buckets: int = 12) -> dict:
    """The share of requests each member answered, their tokens and cost, overall and per time bucket, for the
    group's page. A shared group serves every workspace: each sees only its own requests."""
    since = timezone.now() - timedelta(minutes=minutes)
    rows = list(GroupRequest.objects.filter(group=group, created_at__gte=since).filter(
        own_or_shared(workspace)).values(
        "created_at", "member", "escalated", "fallback", "big_input_tokens", "big_output_tokens",
        "small_input_tokens", "small_output_tokens", "big_cost", "small_cost").order_by("created_at"))

    def figures(batch: list[dict]) -> dict:
        count = len(batch)
        big = sum(1 for r in batch if r["member"] == GroupMember.BIG)
        return {"requests": count, "big": big, "small": count - big,
                "big_share": big / count if count else None, "small_share": (count - big) / count if count else None,
                "escalated": sum(1 for r in batch if r["escalated"]),
                "fallbacks": sum(1 for r in batch if r["fallback"]),
                "big_tokens": sum(r["big_input_tokens"] + r["big_output_tokens"] for r in batch),
                "small_tokens": sum(r["small_input_tokens"] + r["small_output_tokens"] for r in batch),
                "big_cost": sum(r["big_cost"] for r in batch), "small_cost": sum(r["small_cost"] for r in batch)}

    width = timedelta(minutes=minutes) / buckets
    series = []
    for index in range(buckets):
        start = since + width * index
        series.append({"start": start.isoformat(),
                       **figures([r for r in rows if start <= r["created_at"] < start + width])})
    return {"group": group.name, "minutes": minutes, "overall": figures(rows), "series": series}


def metrics_summary(*, deployment: Deployment, minutes: int = 60, buckets: int = 12) -> dict:
    """p50/p90/p99 of TTFT, TPOT and E2E plus output tokens/s, overall and per time bucket, for the charts.

    TPOT exists only for streamed answers (a whole answer arrives at once: there is no time between tokens).
    Output tokens/s is each answered request's tokens over its own request-to-last-token time, pooled: a
    request's tokens are never divided by another request's time."""
    since = timezone.now() - timedelta(minutes=minutes)
    rows = list(RequestRecord.objects.filter(deployment=deployment, created_at__gte=since).values(
        "created_at", "status", "stream", "ttft_ms", "tpot_ms", "e2e_ms", "output_tokens").order_by("created_at"))

    def figures(batch: list[dict]) -> dict:
        out = {"requests": len(batch), "errors": sum(1 for r in batch if r["status"] >= 400)}
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            values = [r[name] for r in batch if r[name] is not None and (r["stream"] or name != "tpot_ms")]
            for percent in (50, 90, 99):
                out[f"{name.removesuffix('_ms')}_p{percent}_ms"] = percentile(values, percent)
        out["output_tokens"] = sum(r["output_tokens"] or 0 for r in batch)
        answered = [r for r in batch if r["status"] < 400 and r["output_tokens"] and r["e2e_ms"]]
        generation_s = sum(r["e2e_ms"] for r in answered) / 1000
        out["tokens_per_s"] = sum(r["output_tokens"] for r in answered) / generation_s if generation_s else None
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
            reported = adapter.live_stats(replica.base_url, replica.api_key, deployment.settings)
            if reported is not None:
                stats[replica.pk] = reported
    return stats


def queued_start(replica: Replica) -> Job | None:
    """The replica's start job while it waits in its node's line."""
    if replica.state not in (ServingState.PENDING, ServingState.STARTING):
        return None
    return Job.objects.filter(kind=START_REPLICA, payload__replica_id=replica.pk,
                              state=JobState.QUEUED).select_related("node").order_by("-pk").first()
