import os
import secrets

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_protect
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from accounts.errors import ValidationFailed, error_body
from accounts.gui import gui_actor, workspace_page
from accounts.selectors import effective_role
from cluster.models import Node
from cluster.scheduling.metrics import PoolCollector
from serving import selectors, services
from serving.engines.base import EMBEDDING, engine
from serving.gateway import Caller, GatewayError, admit, django_response, serve
from serving.groups import services as group_services
from serving.groups.policies import route_settings
from serving.groups.scoring import METRICS
from serving.groups.sources import prompt_sources
from serving.models import CalibrationState, Deployment, Engine, GroupPolicy, RoleHint, ServingState


def _may_scrape(request) -> bool:
    """The metrics name every tenant's deployments and traffic: Prometheus brings FACTORY_METRICS_TOKEN as a bearer
    token; a person must be signed in as staff."""
    sent = request.headers.get("Authorization", "")
    if settings.METRICS_TOKEN and sent.lower().startswith("bearer "):
        return secrets.compare_digest(sent[7:].strip().encode(), settings.METRICS_TOKEN.encode())
    return request.user.is_authenticated and request.user.is_staff


def prometheus_metrics(request):
    """Prometheus scrape endpoint: the gateway's latency histograms, labelled by deployment and replica. With
    several web worker processes (PROMETHEUS_MULTIPROC_DIR set), the sum of all of them."""
    if not _may_scrape(request):
        response = JsonResponse(error_body("unauthenticated", "The metrics need the metrics token "
                                                              "(Authorization: Bearer <FACTORY_METRICS_TOKEN>) or a "
                                                              "staff sign-in."), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        # Figures read from the database at each scrape belong to no process: added once, beside the sum.
        registry.register(PoolCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _deployment_or_404(request, name: str):
    deployment = selectors.deployments_visible_to(workspace=request.workspace).filter(name=name).first()
    if deployment is None:
        raise Http404("No such deployment.")
    return deployment


def _model_or_404(request, model_id: int):
    model = selectors.models_visible_to(workspace=request.workspace).filter(pk=model_id).first()
    if model is None:
        raise Http404("No such model.")
    return model


# The new-deployment form's engine settings, each blank for the engine's default.
ENGINE_SETTING_FIELDS = {"threads": "Threads", "parallel": "Parallel slots", "context_length": "Context per slot",
                         "batch_size": "Batch size", "ubatch_size": "Micro-batch size"}


def _weights(text: str, replicas: int) -> list[float]:
    """'3,1' -> [3.0, 1.0]; blank -> equal weights."""
    if not text.strip():
        return [1.0] * replicas
    try:
        weights = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValidationFailed(f"Weights must be numbers separated by commas, like 3,1 (got '{text}').")
    if len(weights) != replicas:
        raise ValidationFailed(f"Give one weight per replica: {replicas} replica(s), {len(weights)} weight(s).")
    return weights


@workspace_page
def serving_home(request):
    if request.method == "POST":
        model = services.register_model(
            actor=gui_actor(request), workspace=request.workspace, name=request.POST.get("name", ""),
            path=request.POST.get("path", "").strip(), url=request.POST.get("url", "").strip(),
            api_key=request.POST.get("api_key", ""), role_hint=request.POST.get("role_hint") or RoleHint.SMALL)
        messages.success(request, _("Registered %(name)s.") % {"name": model.name})
        return redirect("serving")
    return render(request, "serving/home.html", {
        "models": selectors.models_visible_to(workspace=request.workspace),
        "deployments": selectors.deployments_visible_to(workspace=request.workspace),
        "nodes": Node.objects.all(),
        "engines": Engine.choices,
        "roles": RoleHint.choices,
        "groups": selectors.groups_visible_to(workspace=request.workspace),
        "policies": GroupPolicy.choices,
    })


@workspace_page
def deploy_model(request, model_id: int):
    if request.method != "POST":
        return redirect("serving")
    deployment, created = services.deploy_model(actor=gui_actor(request), workspace=request.workspace,
                                                model=_model_or_404(request, model_id))
    if created:
        messages.success(request, _("Deploying %(name)s: its replica is starting.") % {"name": deployment.name})
    else:
        messages.info(request, _("%(name)s already serves this model; no second deployment was made.")
                      % {"name": deployment.name})
    return redirect("deployment", name=deployment.name)


@workspace_page
def delete_model(request, model_id: int):
    if request.method != "POST":  # where a refused delete's message comes back to without a referrer
        return redirect("serving")
    model = _model_or_404(request, model_id)
    services.delete_model(actor=gui_actor(request), model=model)
    messages.success(request, _("Removed the model %(name)s.") % {"name": model.name})
    return redirect("serving")


@workspace_page
def model_chat_template(request, model_id: int):
    if request.method != "POST":
        return redirect("serving")
    model = services.set_chat_template(actor=gui_actor(request), workspace=request.workspace,
                                       model=_model_or_404(request, model_id),
                                       chat_template=request.POST.get("chat_template", ""))
    chat = _("it now serves chat") if model.supports_chat else _("it has no chat template: completion only")
    messages.success(request, _("Saved the chat template of %(name)s: %(chat)s. Restart its deployments to use it.")
                     % {"name": model.name, "chat": chat})
    return redirect("serving")


@workspace_page
def create_deployment(request):
    if request.method != "POST":
        return redirect("serving")
    try:
        model = _model_or_404(request, int(request.POST.get("model") or 0))
        replicas = int(request.POST.get("replicas") or 1)
        cooldown_s = float(request.POST.get("cooldown_s") or 30)
    except ValueError:
        raise ValidationFailed("Model, replicas, threads and cooldown must be numbers.")
    node = Node.objects.filter(name=request.POST.get("node")).first() or Node.objects.first()
    weights = _weights(request.POST.get("weights", ""), replicas)
    engine_settings = {}
    for name, label in ENGINE_SETTING_FIELDS.items():
        value = request.POST.get(name, "").strip()
        if value and not value.isdigit():
            raise ValidationFailed(f"{label} must be a whole number (got '{value}').")
        if value:
            engine_settings[name] = int(value)
    deployment = services.create_deployment(
        actor=gui_actor(request), workspace=request.workspace, model=model, name=request.POST.get("name", ""),
        engine_name=request.POST.get("engine", ""), settings_=engine_settings,
        replicas=[(node, weight) for weight in weights], cooldown_s=cooldown_s)
    services.start_deployment(actor=gui_actor(request), deployment=deployment)
    return redirect("deployment", name=deployment.name)


@workspace_page
def deployment_page(request, name: str):
    deployment = _deployment_or_404(request, name)
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "start":
            services.start_deployment(actor=gui_actor(request), deployment=deployment)
        elif action == "stop":
            services.stop_deployment(actor=gui_actor(request), deployment=deployment)
        elif action == "delete":
            services.delete_deployment(actor=gui_actor(request), deployment=deployment)
            messages.success(request, _("Deleted the deployment %(name)s; its engines were stopped.")
                             % {"name": deployment.name})
            return redirect("serving")
        elif action == "routing":
            weights = {}
            for replica in deployment.replicas.all():
                value = request.POST.get(f"weight-{replica.pk}")
                try:
                    weights[replica.pk] = float(value) if value else replica.weight
                except ValueError:
                    raise ValidationFailed(f"The weight of replica {replica.pk} must be a number.")
            try:
                cooldown_s = float(request.POST.get("cooldown_s") or deployment.cooldown_s)
            except ValueError:
                raise ValidationFailed("The cooldown must be a number of seconds.")
            services.update_routing(actor=gui_actor(request), deployment=deployment, cooldown_s=cooldown_s,
                                    weights=weights)
            messages.success(request, _("Routing saved."))
        return redirect("deployment", name=deployment.name)
    return render(request, "serving/deployment.html", {
        "deployment": deployment,
        "capabilities": sorted(engine(deployment.engine).capabilities(deployment.model)),
        "events": deployment.events.select_related("replica")[:30],
        # A shared deployment serves every workspace: each sees only its own requests.
        "requests": deployment.requests.filter(selectors.own_or_shared(request.workspace))[:20],
    })


@workspace_page
def deployment_state(request, name: str):
    """The live state the deployment page polls."""
    deployment = _deployment_or_404(request, name)
    stats = selectors.engine_stats(deployment=deployment)
    return JsonResponse({"state": deployment.state, "stoppable": deployment.stoppable, "replicas": [
        {"id": r.pk, "state": r.state, "pid": r.pid, "restarts": r.restarts, "last_error": r.last_error,
         "engine": stats.get(r.pk)}
        for r in deployment.replicas.all()]})


def _answers_now(item) -> bool:
    """A chat deployment that is ready, or a model group with a member that is."""
    members = [item] if isinstance(item, Deployment) else [item.big, item.small, item.speculative_deployment]
    return any(member is not None and member.state == ServingState.READY for member in members)


@workspace_page
def playground(request):
    chat_ready = [item for item in selectors.chat_models(workspace=request.workspace) if _answers_now(item)]
    # `compare`: a second deployment answering the same chat beside the first (a tuned model and its base).
    return render(request, "serving/playground.html", {"deployments": chat_ready,
                                                       "selected": request.GET.get("deployment", ""),
                                                       "compare": request.GET.get("compare", ""),
                                                       "panes": ["", "-compare"]})


@csrf_protect
async def playground_chat(request):
    """The Playground's chat goes through the gateway like any client, as the signed-in user's workspace."""
    user = await request.auser()
    if not user.is_authenticated or request.workspace is None:
        return JsonResponse(error_body("unauthenticated", "Sign in to use the Playground."), status=401)
    role = await sync_to_async(effective_role)(user=user, api_key=None, workspace=request.workspace)
    caller = Caller(workspace_id=request.workspace.pk, role=role)
    try:
        await admit(caller)
    except GatewayError as exc:
        return django_response(exc.reply())
    return django_response(await serve("chat/completions", method=request.method, content=request.body,
                                       caller=caller))


def _group_or_404(request, name: str):
    group = selectors.groups_visible_to(workspace=request.workspace).filter(name=name).first()
    if group is None:
        raise Http404("No such model group.")
    return group


def _deployment_named(request, name: str):
    return _deployment_or_404(request, name) if name else None


def _number(text: str, label: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValidationFailed(f"{label} must be a number (got '{text}').")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


@workspace_page
def create_model_group(request):
    if request.method != "POST":
        return redirect("serving")
    post = request.POST
    draft = None
    if post.get("draft"):
        draft = _model_or_404(request, int(post["draft"]) if post["draft"].isdigit() else 0)
    group = group_services.create_group(
        actor=gui_actor(request), workspace=request.workspace, name=post.get("name", ""),
        policy=post.get("policy", ""), big=_deployment_named(request, post.get("big", "")),
        small=_deployment_named(request, post.get("small", "")), draft=draft,
        threshold=_number(post.get("threshold") or "0.5", "The threshold"))
    messages.success(request, f"Model group {group.name} answers at /v1 as model=\"{group.name}\".")
    return redirect("model-group", name=group.name)


def _save_group_settings(request, group) -> None:
    post = request.POST
    settings_ = {**group.settings, "route": {
        "score": post.get("route_score") or "rules", "embedding_deployment": post.get("embedding_deployment", ""),
        "length_scale": _number(post.get("length_scale") or "2000", "The length scale"),
        "keywords": _lines(post.get("keywords", "")), "patterns": _lines(post.get("patterns", "")),
        "keyword_weight": _number(post.get("keyword_weight") or "0.5", "The keyword weight"),
        "pattern_weight": _number(post.get("pattern_weight") or "0.5", "The pattern weight")},
        "cascade": {"confidence": post.get("confidence") or "mean"}}
    group_services.update_group(actor=gui_actor(request), group=group, policy=post.get("policy") or None,
                                threshold=_number(post.get("threshold") or str(group.threshold), "The threshold"),
                                settings=settings_)
    messages.success(request, "Model group saved.")


def _start_calibration(request, group) -> None:
    upload, chosen = request.FILES.get("file"), request.POST.get("prompt_set", "")
    try:
        max_tokens = int(request.POST.get("max_tokens") or 128)
    except ValueError:
        raise ValidationFailed("Max tokens must be a whole number.")
    if upload is not None:
        items, source = group_services.calibration_items_from_file(content=upload.read()), f"uploaded {upload.name}"
    elif chosen:
        key, _colon, set_id = chosen.partition(":")
        items, source = group_services.calibration_items_from_source(
            workspace=request.workspace, source=key, set_id=int(set_id) if set_id.isdigit() else 0)
    else:
        raise ValidationFailed("Choose a JSONL file of prompts with reference answers, or a studio's prompt set.")
    group_services.start_calibration(actor=gui_actor(request), workspace=request.workspace, group=group,
                                     items=items, source=source,
                                     metric=request.POST.get("metric") or "token_f1", max_tokens=max_tokens,
                                     judge=request.POST.get("judge", ""))
    messages.success(request, f"Calibrating on {len(items)} prompts: both members answer each one.")


def _pick_point(request, group) -> None:
    run = group.calibrations.filter(workspace=request.workspace, pk=request.POST.get("run") or 0).first()
    if run is None:
        raise Http404("No such calibration run.")
    policy, _colon, threshold = request.POST.get("pick", "").partition(":")
    group_services.pick_calibration_point(actor=gui_actor(request), run=run, policy=policy,
                                          threshold=_number(threshold, "The threshold"))
    messages.success(request, f"{group.name} now uses the {policy} policy at this point of the curve.")


@workspace_page
def model_group_page(request, name: str):
    group = _group_or_404(request, name)
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "settings":
            _save_group_settings(request, group)
        elif action == "calibrate":
            _start_calibration(request, group)
        elif action == "pick":
            _pick_point(request, group)
        elif action == "cancel_calibration":
            run_id = request.POST.get("id", "")
            run = group.calibrations.filter(workspace=request.workspace, pk=int(run_id)).first() \
                if run_id.isdigit() else None
            if run is None:
                raise Http404("No such calibration run.")
            group_services.cancel_calibration(actor=gui_actor(request), run=run)
            messages.success(request, _("Cancelled; the answers so far are kept."))
        elif action == "delete":
            group_services.delete_group(actor=gui_actor(request), group=group)
            messages.success(request, f"Deleted the model group {name}; its members stay deployed.")
            return redirect("serving")
        return redirect("model-group", name=group.name)
    runs = list(group.calibrations.filter(workspace=request.workspace)[:10])
    for run in runs:
        place = group_services.calibration_place(run)
        run.place = place.as_dict() if place else None
    shown = next((run for run in runs if run.state == CalibrationState.DONE), None)
    return render(request, "serving/group.html", {
        "group": group, "policies": GroupPolicy.choices,
        "embedding_deployments": [d.name for d in selectors.deployments_visible_to(workspace=request.workspace)
                                  if EMBEDDING in engine(d.engine).capabilities(d.model)],
        "route": route_settings(group.settings.get("route") or {}),
        "confidence": (group.settings.get("cascade") or {}).get("confidence", "mean"),
        "requests": group.requests.filter(selectors.own_or_shared(request.workspace))[:20],
        "runs": runs, "shown": shown, "metrics": METRICS,
        "judges": selectors.chat_model_names(workspace=request.workspace),
        "prompt_sets": [(f"{source.key}:{set_id}", f"{source.label}: {name}") for source in prompt_sources()
                        for set_id, name in source.sets(workspace=request.workspace)],
        "curve_tables": [(policy, points, (shown.summary.get("suggested") or {}).get(policy))
                         for policy, points in shown.curves.items()] if shown else [],
        "running": any(run.state in (CalibrationState.QUEUED, CalibrationState.RUNNING) for run in runs),
    })
