"""Model groups' writes and rules: create and change a group, start a calibration, pick a point of its curve.

A group's name shares the deployments' namespace (both are what clients pass as `model`). A workspace's groups are
changed by its developers, shared ones (no workspace) only by platform administrators, as deployments are.
"""

import math

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from accounts.errors import Conflict, NotFound, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role, require_role_or_platform
from cluster import queues
from serving.engines.base import CHAT, EngineRefused, engine
from serving.groups import calibration, classifier, policies, scoring, sources
from serving.models import (
    CalibrationRun,
    CalibrationState,
    Deployment,
    Engine,
    GroupPolicy,
    Model,
    ModelGroup,
    ServingState,
)
from serving.selectors import chat_model_problem
from serving.services import create_deployment, start_deployment, stop_deployment

SETTINGS_KEYS = {"route", "cascade", "costs", "classifier"}
ROUTE_CLASSIFIER = "route-classifier"
MAX_CALIBRATION_TOKENS = 1024


def _refuse(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, fields={field: [message]})


def _threshold(value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not 0 <= value <= 1:
        raise _refuse("threshold", f"The threshold must be a number from 0 to 1; got {value!r}.")
    return float(value)


def _checked_settings(raw) -> dict:
    if not isinstance(raw, dict):
        raise _refuse("settings", "'settings' must be an object.")
    unknown = sorted(set(raw) - SETTINGS_KEYS)
    if unknown:
        raise _refuse("settings", f"Unknown settings: {', '.join(unknown)}; a group takes "
                                  f"{', '.join(sorted(SETTINGS_KEYS))}.")
    try:
        value = {"route": policies.route_settings(raw.get("route") or {}),
                 "cascade": policies.cascade_settings(raw.get("cascade") or {})}
    except policies.PolicySettingsInvalid as exc:
        raise _refuse("settings", str(exc))
    if raw.get("classifier") is not None:
        try:
            value["classifier"] = classifier.check(raw["classifier"])
        except ValueError as exc:
            raise _refuse("settings", str(exc))
    if value["route"]["score"] == "classifier" and "classifier" not in value:
        raise _refuse("settings", "A route scored by a classifier needs one trained by calibration: calibrate with "
                                  "an embedding deployment and pick a point of the route-classifier curve.")
    costs = raw.get("costs") or {}
    if not isinstance(costs, dict) or set(costs) - {"big", "small"} or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in costs.values()):
        raise _refuse("settings", "'costs' maps 'big' and 'small' to a cost per 1,000 tokens (0 or more).")
    if costs:
        value["costs"] = {member: float(cost) for member, cost in costs.items()}
    return value


def _member(workspace: Workspace | None, deployment: Deployment | None, field: str) -> Deployment:
    """A deployment the group may use: the group's workspace's own or a shared one (a shared group only shared
    ones), one that serves chat."""
    if deployment is None:
        raise _refuse(field, f"The group needs a '{field}' deployment.")
    if deployment.workspace_id is not None and deployment.workspace_id != getattr(workspace, "pk", None):
        raise NotFound(_("No deployment called '%(deployment)s'.") % {"deployment": deployment.name})
    if CHAT not in engine(deployment.engine).capabilities(deployment.model):
        raise _refuse(field, f"'{deployment.name}' cannot chat (an embedding or completion-only model); a group's "
                             f"members answer chats.")
    return deployment


def _require_change(actor: Actor, workspace: Workspace | None) -> None:
    require_role_or_platform(actor=actor, workspace=workspace, role=Role.DEVELOPER,
                             action="Changing a model group that every workspace shares")


def _speculative_deployment(actor: Actor, group: ModelGroup) -> Deployment:
    """The big model's deployment that decodes with the draft: made (and started) once for the group, on the big
    deployment's nodes with its settings. Refused with the reason where the engine cannot draft or the
    vocabularies differ."""
    big, draft = group.big, group.draft
    if big.engine != Engine.LLAMACPP:
        raise _refuse("policy", f"Speculative decoding needs a llama.cpp big member here; '{big.name}' runs on "
                                f"{big.get_engine_display()}.")
    settings_ = {**big.settings, "draft_model_id": draft.pk}
    try:
        engine(big.engine).check_settings(model=big.model, settings=settings_,
                                          nodes=[replica.node for replica in big.replicas.all()])
    except EngineRefused as exc:
        raise _refuse("draft", str(exc))
    replicas = [(replica.node, replica.weight) for replica in big.replicas.select_related("node")]
    deployment = create_deployment(actor=actor, workspace=group.workspace, model=big.model,
                                   name=f"{group.name}-speculative", settings_=settings_, replicas=replicas,
                                   cooldown_s=big.cooldown_s)
    return start_deployment(actor=actor, deployment=deployment)


@transaction.atomic
def create_group(*, actor: Actor, workspace: Workspace | None, name: str, policy: str, big: Deployment | None,
                 small: Deployment | None = None, draft: Model | None = None, threshold=0.5,
                 settings: dict | None = None) -> ModelGroup:
    """A group of a big and a small deployment (speculative: a big deployment and a draft model, the small
    member's model when none is named) behind one name."""
    _require_change(actor, workspace)
    name = slugify(name)
    if not name:
        raise _refuse("name", "A model group needs a name.")
    if policy not in GroupPolicy.values:
        raise _refuse("policy", f"'policy' must be one of {', '.join(GroupPolicy.values)}.")
    big = _member(workspace, big, "big")
    if policy != GroupPolicy.SPECULATIVE or small is not None:
        small = _member(workspace, small, "small")
        if small.pk == big.pk:
            raise _refuse("small", "The small member must be another deployment than the big one.")
    if policy == GroupPolicy.SPECULATIVE:
        draft = draft or (small.model if small else None)
        if draft is None:
            raise _refuse("draft", "A speculative group needs a draft model (or a small member whose model drafts).")
        if draft.workspace_id is not None and draft.workspace_id != getattr(workspace, "pk", None):
            raise NotFound(_("No model called '%(draft)s'.") % {"draft": draft.name})
    if Deployment.objects.filter(name=name).exists() or ModelGroup.objects.filter(name=name).exists():
        raise Conflict(_("'%(name)s' is already the name of a deployment or model group; clients tell them apart by "
                         "name alone.") % {"name": name})
    try:
        with transaction.atomic():
            group = ModelGroup.objects.create(workspace=workspace, name=name, policy=policy, big=big, small=small,
                                              draft=draft if policy == GroupPolicy.SPECULATIVE else None,
                                              threshold=_threshold(threshold),
                                              settings=_checked_settings(settings or {}))
    except IntegrityError:
        raise Conflict(_("A model group called '%(name)s' already exists.") % {"name": name})
    if policy == GroupPolicy.SPECULATIVE:
        group.speculative_deployment = _speculative_deployment(actor, group)
        group.save(update_fields=["speculative_deployment"])
    record_audit(actor=actor, workspace=workspace, action="model_group.create", target=group,
                 detail={"policy": policy, "big": big.name, "small": small.name if small else None,
                         "draft": draft.name if draft else None, "threshold": group.threshold})
    return group


@transaction.atomic
def update_group(*, actor: Actor, group: ModelGroup, policy: str | None = None, threshold=None,
                 settings: dict | None = None, small: Deployment | None = None) -> ModelGroup:
    """Change the policy between route and cascade, the threshold, the settings or the small member. A
    speculative group is made as one (its deployment decodes with the draft) and stays one."""
    _require_change(actor, group.workspace)
    changes = {}
    if policy is not None and policy != group.policy:
        if policy not in (GroupPolicy.ROUTE, GroupPolicy.CASCADE) or group.policy == GroupPolicy.SPECULATIVE:
            raise _refuse("policy", "A group switches between route and cascade; a speculative group is made as one.")
        group.policy = changes["policy"] = policy
    if small is not None:
        member = _member(group.workspace, small, "small")
        if member.pk == group.big_id:
            raise _refuse("small", "The small member must be another deployment than the big one.")
        group.small, changes["small"] = member, member.name
    if group.policy != GroupPolicy.SPECULATIVE and group.small is None:
        raise _refuse("small", f"A {group.policy} group needs a small member.")
    if threshold is not None:
        group.threshold = changes["threshold"] = _threshold(threshold)
    if settings is not None:
        group.settings = _checked_settings(settings)
        changes["settings"] = group.settings
    group.save()
    record_audit(actor=actor, workspace=group.workspace, action="model_group.update", target=group, detail=changes)
    return group


@transaction.atomic
def delete_group(*, actor: Actor, group: ModelGroup) -> None:
    """The group's name stops answering; its members stay deployed (a speculative group's own deployment is
    stopped and kept, for its history)."""
    _require_change(actor, group.workspace)
    record_audit(actor=actor, workspace=group.workspace, action="model_group.delete", target=group,
                 detail={"name": group.name})
    if group.speculative_deployment is not None:
        stop_deployment(actor=actor, deployment=group.speculative_deployment)
    group.delete()


def start_calibration(*, actor: Actor, workspace: Workspace, group: ModelGroup, items, source: str,
                      metric: str = "token_f1", max_tokens: int = 128, temperature: float = 0.2,
                      judge: str = "") -> CalibrationRun:
    """Queue a calibration of `group` on prompt/reference pairs (uploaded, or handed over by a studio). With a
    judge (a chat deployment or group), each answer is graded by it rather than by token overlap."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    if group.workspace_id is not None and group.workspace_id != workspace.pk:
        raise NotFound(_("No model group called '%(group)s'.") % {"group": group.name})
    if group.policy == GroupPolicy.SPECULATIVE or group.small is None:
        raise _refuse("group", "A speculative group has no threshold to calibrate: every request is the big model's, "
                               "drafted.")
    if judge:
        metric = scoring.JUDGE
        if problem := chat_model_problem(workspace=workspace, name=judge):
            raise _refuse("judge", problem)
    if metric not in scoring.METRICS:
        raise _refuse("metric", f"'metric' must be one of {', '.join(scoring.METRICS)}.")
    if metric == scoring.JUDGE and not judge:
        raise _refuse("judge", "The judge metric needs a 'judge': the chat deployment that grades the answers.")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= \
            MAX_CALIBRATION_TOKENS:
        raise _refuse("max_tokens", f"'max_tokens' must be a whole number from 1 to {MAX_CALIBRATION_TOKENS}.")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        raise _refuse("temperature", "'temperature' must be a number from 0 to 2.")
    try:
        items = calibration.checked_items(items)
    except calibration.CalibrationInputInvalid as exc:
        raise _refuse("items", str(exc))
    not_ready = [d.name for d in (group.big, group.small) if d.state != ServingState.READY]
    if not_ready:
        raise Conflict(_("Calibration runs both members; start %(values)s first.") % {"values": ', '.join(not_ready)})
    queues.check_job_limit(getattr(workspace, "pk", None))
    run = CalibrationRun.objects.create(group=group, workspace=workspace, created_by=actor.user, items=items,
                                        source=source[:200], metric=metric, max_tokens=max_tokens,
                                        temperature=float(temperature), judge=judge)
    record_audit(actor=actor, workspace=workspace, action="model_group.calibrate", target=group,
                 detail={"run": run.pk, "items": len(items), "source": run.source})
    from serving.tasks import CALIBRATION_QUEUE, calibrate_group

    transaction.on_commit(lambda: queues.send(calibrate_group.name, [run.pk], queue=CALIBRATION_QUEUE,
                                              workspace_id=getattr(workspace, "pk", None)))
    return run


def active_calibrations(workspace_id: int) -> int:
    """The workspace's calibrations queued or running (its job limit)."""
    return CalibrationRun.objects.filter(workspace_id=workspace_id,
                                         state__in=[CalibrationState.QUEUED, CalibrationState.RUNNING]).count()


def cancel_calibration(*, actor: Actor, run: CalibrationRun) -> CalibrationRun:
    """Stop a calibration: a queued one leaves the line at once, a running one stops before its next prompt; the
    answers so far are kept on the run."""
    require_role(actor=actor, workspace=run.workspace, role=Role.DEVELOPER)
    if not CalibrationRun.objects.filter(pk=run.pk, state__in=[CalibrationState.QUEUED, CalibrationState.RUNNING]) \
            .update(state=CalibrationState.CANCELLED, finished_at=timezone.now()):
        raise Conflict(_("Calibration %(run)s is %(state)s; only a queued or running one can be cancelled.")
                       % {"run": run.pk, "state": run.state})
    from serving.tasks import CALIBRATION_QUEUE, calibrate_group

    queues.withdraw(CALIBRATION_QUEUE, calibrate_group.name, [run.pk])
    record_audit(actor=actor, workspace=run.workspace, action="model_group.calibration.cancel", target=run.group,
                 detail={"run": run.pk})
    run.refresh_from_db()
    return run


def calibration_place(run: CalibrationRun) -> queues.Place | None:
    """Where a queued calibration stands in the interactive line."""
    if run.state != CalibrationState.QUEUED:
        return None
    from serving.tasks import calibrate_group

    return queues.interactive_line().place(
        calibrate_group.name, [run.pk], workspace_id=run.workspace_id, default_s=120.0,
        reason=_("waiting for the interactive worker (evaluations, tuning, calibration)"))


def calibration_items_from_source(*, workspace: Workspace, source: str, set_id: int) -> tuple[list[dict], str]:
    """A studio's prompt set (sources.py), and the words that name it on the run."""
    found = sources.find(source)
    if found is None:
        known = ", ".join(s.key for s in sources.prompt_sources()) or "none"
        raise _refuse("source", f"'{source}' is not a prompt source; the sources are: {known}.")
    items = found.items(workspace=workspace, set_id=set_id)
    if items is None:
        raise NotFound(_("No %(label)s %(set_id)s in this workspace.") % {"label": found.label, "set_id": set_id})
    name = dict(found.sets(workspace=workspace)).get(set_id, set_id)
    return items, f"{found.label} '{name}'"


def calibration_items_from_file(*, content: bytes) -> list[dict]:
    try:
        return calibration.items_from_jsonl(content)
    except calibration.CalibrationInputInvalid as exc:
        raise _refuse("file", str(exc))


@transaction.atomic
def pick_calibration_point(*, actor: Actor, run: CalibrationRun, policy: str, threshold) -> ModelGroup:
    """Set the group's policy and threshold to a point of the run's curve."""
    group = ModelGroup.objects.select_for_update().get(pk=run.group_id)
    _require_change(actor, group.workspace)
    if run.state != CalibrationState.DONE:
        raise Conflict(_("The calibration is %(state)s; a point is picked from a finished one.")
                       % {"state": run.state})
    points = run.curves.get(policy) if isinstance(policy, str) else None
    if not points:
        raise _refuse("policy", f"The calibration drew curves for {', '.join(sorted(run.curves))}.")
    threshold = _threshold(threshold)
    point = next((p for p in points if math.isclose(p["threshold"], threshold, abs_tol=1e-4)), None)
    if point is None:
        raise _refuse("threshold", f"{threshold} is not a point of the {policy} curve.")
    settings_ = None
    if policy in (GroupPolicy.ROUTE, ROUTE_CLASSIFIER):
        route = {**(group.settings.get("route") or {}), "score": "rules" if policy == GroupPolicy.ROUTE else
                 "classifier"}
        settings_ = {**group.settings, "route": route}
        if policy == ROUTE_CLASSIFIER:
            settings_["classifier"] = run.summary["classifier"]
    group = update_group(actor=actor, group=group, policy=GroupPolicy.CASCADE if policy == GroupPolicy.CASCADE
                         else GroupPolicy.ROUTE, threshold=point["threshold"], settings=settings_)
    run.chosen = {"policy": policy, **point}
    run.save(update_fields=["chosen"])
    return group
