"""Workflows' writes and rules: save (every change a new version, checked first), delete, start a run (queued on
the interactive line), cancel. Plain arguments, typed errors."""

import json
import math

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from agent_studio import events
from agent_studio.runs import evaluations
from agent_studio.runs.fields import FINAL_RUN_STATES, EvalStatus, RunStatus
from agent_studio.services import check_answer_checks
from agent_studio.workflows.graph import check_graph
from agent_studio.workflows.models import Workflow, WorkflowEvalRun, WorkflowRun, WorkflowScenario, WorkflowVersion
from assets.models import AssetKind
from assets.services import forget_asset, payload_checksum, register_asset
from cluster import queues

EXECUTE_TASK = "agent_studio.workflows.tasks.execute_workflow_run"
MAX_INPUTS_CHARS = 100_000
INPUT_TYPES = {"string": str, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def validate(*, actor: Actor, workspace: Workspace, graph) -> dict:
    """The graph as it would be saved, or the 400 naming the node at fault."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    return check_graph(workspace=workspace, raw=graph)


# A layout names at most this many nodes: far more than a canvas shows, few enough to bound the row.
MAX_LAYOUT_NODES = 1000


def clean_layout(raw) -> dict:
    """{node id: {"x", "y"}} with finite numbers, or the 400 naming what is wrong. Ids are not checked against the
    graph: the canvas keeps the place of a node it has not saved yet."""
    if not isinstance(raw, dict):
        raise ValidationFailed(_("'layout' must be an object of node id: {\"x\": number, \"y\": number}."),
                               fields={"layout": ["Not an object."]})
    if len(raw) > MAX_LAYOUT_NODES:
        raise ValidationFailed(_("'layout' names more than %(limit)d nodes.") % {"limit": MAX_LAYOUT_NODES},
                               fields={"layout": ["Too large."]})
    cleaned = {}
    for node_id, place in raw.items():
        coordinates = [place.get(axis) if isinstance(place, dict) else None for axis in ("x", "y")]
        if len(node_id) > 64 or not all(isinstance(value, (int, float)) and not isinstance(value, bool)
                                        and math.isfinite(value) for value in coordinates):
            raise ValidationFailed(_("'layout': the place of %(node)s must be {\"x\": number, \"y\": number}.")
                                   % {"node": node_id[:64]}, fields={"layout": [node_id[:64]]})
        cleaned[node_id] = {"x": round(coordinates[0], 1), "y": round(coordinates[1], 1)}
    return cleaned


def save_layout(*, actor: Actor, workflow: Workflow, layout) -> Workflow:
    """Where the canvas draws the nodes; not a change of the graph, so no new version."""
    require_role(actor=actor, workspace=workflow.workspace, role=Role.DEVELOPER)
    workflow.layout = clean_layout(layout)
    workflow.save(update_fields=["layout", "updated_at"])
    return workflow


@transaction.atomic
def save_workflow(*, actor: Actor, workspace: Workspace, workflow: Workflow | None = None, name: str, graph,
                  description: str = "", layout=None) -> Workflow:
    """Save a checked graph (a new version when it changed) and, when given, the canvas's layout of its nodes."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    name = (name or "").strip()
    if not name or len(name) > 64:
        raise ValidationFailed("A workflow needs a name of at most 64 characters.", fields={"name": ["Required."]})
    checked = check_graph(workspace=workspace, raw=graph)
    layout = clean_layout(layout) if layout is not None else None
    try:
        with transaction.atomic():
            workflow = workflow or Workflow(workspace=workspace, created_by=actor.user)
            changed = workflow.graph != checked or workflow.version == 0
            workflow.name, workflow.description, workflow.graph = name, (description or "")[:500], checked
            if layout is not None:
                known = {node["id"] for node in checked["nodes"]}
                workflow.layout = {node_id: place for node_id, place in layout.items() if node_id in known}
            if changed:
                workflow.version += 1
            workflow.save()
    except IntegrityError:
        raise Conflict(_("This workspace already has a workflow called '%(name)s'.") % {"name": name},
                       fields={"name": ["Taken."]})
    if changed:
        WorkflowVersion.objects.create(workflow=workflow, number=workflow.version, graph=checked,
                                       checksum=payload_checksum(checked))
    register_asset(workspace=workspace, kind=AssetKind.WORKFLOW, ref_id=workflow.pk, name=workflow.name,
                   payload=checked, actor=actor,
                   summary={"version": workflow.version, "nodes": len(checked["nodes"])})
    record_audit(actor=actor, workspace=workspace, action="workflow.save", target=workflow,
                 detail={"version": workflow.version})
    return workflow


@transaction.atomic
def delete_workflow(*, actor: Actor, workflow: Workflow) -> None:
    """Delete a workflow with its versions; its finished runs stay under its name. Refused while a run is
    unfinished."""
    require_role(actor=actor, workspace=workflow.workspace, role=Role.DEVELOPER)
    unfinished = workflow.runs.exclude(status__in=FINAL_RUN_STATES).count()
    if unfinished:
        raise Conflict(_("'%(name)s' has %(count)d unfinished run(s); wait for them or cancel them first.")
                       % {"name": workflow.name, "count": unfinished})
    record_audit(actor=actor, workspace=workflow.workspace, action="workflow.delete", target=workflow,
                 detail={"name": workflow.name})
    forget_asset(workspace=workflow.workspace, kind=AssetKind.WORKFLOW, ref_id=workflow.pk)
    try:
        with transaction.atomic():
            workflow.delete()
    except ProtectedError:
        # A published app's release holds one of its versions.
        raise Conflict(_("'%(name)s' is published as an app; delete the app first.") % {"name": workflow.name})


def workflow_version(workflow: Workflow, number: int | None = None) -> WorkflowVersion:
    version = workflow.versions.filter(number=number).first() if number else workflow.versions.first()
    if version is None:
        raise ValidationFailed(_("'%(name)s' has no version %(number)s.") % {"name": workflow.name, "number": number},
                               fields={"version": ["Unknown."]})
    return version


def clean_inputs(graph: dict, raw) -> dict:
    if not isinstance(raw, dict):
        raise ValidationFailed("'inputs' must be an object of name: value.", fields={"inputs": ["Not an object."]})
    if len(json.dumps(raw, default=str)) > MAX_INPUTS_CHARS:
        raise ValidationFailed(_("'inputs' is larger than %(limit)d characters.") % {"limit": MAX_INPUTS_CHARS},
                               fields={"inputs": ["Too large."]})
    declared = {item["name"]: item for item in graph["inputs"]}
    if unknown := sorted(set(raw) - set(declared)):
        raise ValidationFailed(_("The workflow has no input %(names)s.") % {"names": ", ".join(unknown)},
                               fields={"inputs": unknown})
    cleaned = {}
    for name, item in declared.items():
        value = raw.get(name)
        if value is None:
            if item["required"]:
                raise ValidationFailed(_("The input '%(name)s' is required.") % {"name": name},
                                       fields={"inputs": [name]})
        elif isinstance(value, bool) != (item["type"] == "boolean") or not isinstance(value, INPUT_TYPES[item["type"]]):
            raise ValidationFailed(_("The input '%(name)s' must be a %(type)s.") % {"name": name, "type": item["type"]},
                                   fields={"inputs": [name]})
        cleaned[name] = value
    return cleaned


# The input a chat message fills: a workflow with one of these (a string) and no other required input is
# chat-shaped, so a published app can serve it on OpenAI's chat/completions.
CHAT_INPUTS = ("query", "question", "message")
# An optional input of that name gets the conversation so far ([{role, content}, ...]) from a published app.
HISTORY_INPUT = "history"


def chat_input(graph: dict) -> str | None:
    """The name of the input a chat message maps to, or None when the workflow is not chat-shaped."""
    declared = {item["name"]: item for item in graph["inputs"]}
    name = next((name for name in CHAT_INPUTS if declared.get(name, {}).get("type") == "string"), None)
    if name is None or any(item["required"] for other, item in declared.items() if other != name):
        return None
    return name


@transaction.atomic
def start_run(*, actor: Actor | None, workflow: Workflow, inputs, version: WorkflowVersion | None = None,
              caller: str = "api", run_as=None) -> WorkflowRun:
    """Queue a run of the workflow (its latest version unless given) on `inputs`; a worker on the interactive
    line runs it. Its nodes act with the rights of `run_as`: the actor, or for a published app (actor None:
    runtime has authorised the app key) the user who published it."""
    if actor is not None:
        require_role(actor=actor, workspace=workflow.workspace, role=Role.DEVELOPER)
        run_as = actor.user
    version = version or workflow_version(workflow)
    run = WorkflowRun.objects.create(workspace=workflow.workspace, workflow=workflow, workflow_name=workflow.name,
                                     version=version, caller=caller[:64],
                                     inputs=clean_inputs(version.graph, inputs), created_by=run_as)
    events.publish(run.public_id, "status", {"status": RunStatus.QUEUED})
    dispatch(run)
    return run


def dispatch(run: WorkflowRun) -> None:
    transaction.on_commit(lambda: queues.send(EXECUTE_TASK, [run.pk], queue=queues.INTERACTIVE,
                                              workspace_id=run.workspace_id))


@transaction.atomic
def cancel_run(*, actor: Actor, run: WorkflowRun) -> WorkflowRun:
    """Stop a run: at once if it is queued, before its next node if it is running."""
    require_role(actor=actor, workspace=run.workspace, role=Role.DEVELOPER)
    run = WorkflowRun.objects.select_for_update().get(pk=run.pk)
    if run.finished:
        raise Conflict(_("The run is already %(status)s.") % {"status": run.status})
    run.cancel_requested = True
    fields = ["cancel_requested"]
    if run.status == RunStatus.QUEUED:
        run.status, run.error, run.finished_at = RunStatus.CANCELLED, "The run was cancelled.", timezone.now()
        fields += ["status", "error", "finished_at"]
    run.save(update_fields=fields)
    if run.status == RunStatus.CANCELLED:
        from agent_studio.workflows.runner import run_payload

        # Out of the interactive line at once, rather than when a worker takes it and finds nothing to do.
        transaction.on_commit(lambda: queues.withdraw(queues.INTERACTIVE, EXECUTE_TASK, [run.pk]))
        events.publish(run.public_id, "cancelled", run_payload(run))
    return run


def _node_ids(value, graph: dict, field: str) -> list[str]:
    known = {node["id"] for node in graph["nodes"]}
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValidationFailed(_("'%(field)s' must be a list of node ids.") % {"field": field},
                               fields={field: ["Invalid."]})
    if unknown := sorted(set(value) - known):
        raise ValidationFailed(_("'%(field)s' names %(nodes)s, which the workflow does not have.")
                               % {"field": field, "nodes": ", ".join(unknown)},
                               fields={field: unknown})
    return value


@transaction.atomic
def save_scenario(*, actor: Actor, workflow: Workflow, scenario: WorkflowScenario | None = None, name: str,
                  inputs, checks=(), expected_nodes=(), forbidden_nodes=()) -> WorkflowScenario:
    """A case the workflow's evaluation runs: its inputs checked against the latest version's, its checks as an
    agent scenario's, the nodes it names the workflow's own."""
    require_role(actor=actor, workspace=workflow.workspace, role=Role.DEVELOPER)
    if not isinstance(name, str) or not name.strip() or len(name) > 120:
        raise ValidationFailed("A scenario needs a name of at most 120 characters.", fields={"name": ["Required."]})
    graph = workflow_version(workflow).graph
    checks = list(checks)
    check_answer_checks(checks)
    fields = {"inputs": clean_inputs(graph, inputs), "checks": checks,
              "expected_nodes": _node_ids(list(expected_nodes), graph, "expected_nodes"),
              "forbidden_nodes": _node_ids(list(forbidden_nodes), graph, "forbidden_nodes")}
    try:
        with transaction.atomic():
            if scenario is None:
                scenario = WorkflowScenario.objects.create(workflow=workflow, name=name.strip(), **fields)
            else:
                WorkflowScenario.objects.filter(pk=scenario.pk).update(name=name.strip(), **fields)
                scenario.refresh_from_db()
    except IntegrityError:
        raise Conflict(_("'%(workflow)s' already has a scenario called '%(name)s'.")
                       % {"workflow": workflow.name, "name": name.strip()},
                       fields={"name": ["Taken."]})
    return scenario


def delete_scenario(*, actor: Actor, scenario: WorkflowScenario) -> None:
    require_role(actor=actor, workspace=scenario.workflow.workspace, role=Role.DEVELOPER)
    scenario.delete()


EVALUATE_TASK = "agent_studio.workflows.tasks.run_workflow_evaluation"


@transaction.atomic
def start_evaluation(*, actor: Actor, workflow: Workflow, version_number: int | None = None,
                     include_safety: bool = True) -> WorkflowEvalRun:
    """Score a version on the workflow's scenarios and, unless told not to, on the shipped probes that attack
    through a chat message; queued on the interactive line, within the workspace's job limit."""
    require_role(actor=actor, workspace=workflow.workspace, role=Role.DEVELOPER)
    version = workflow_version(workflow, version_number)
    if not workflow.scenarios.exists() and not (include_safety and chat_input(version.graph)):
        raise ValidationFailed("Add a scenario first (a workflow that is not chat-shaped has no safety probes).",
                               fields={"scenarios": ["None yet."]})
    queues.check_job_limit(workflow.workspace_id)
    evaluation = evaluations.queue(WorkflowEvalRun, EVALUATE_TASK, workspace_id=workflow.workspace_id,
                                  workflow=workflow, version=version, include_safety=bool(include_safety),
                                  created_by=actor.user)
    record_audit(actor=actor, workspace=workflow.workspace, action="workflow.evaluation.start", target=workflow,
                 detail={"evaluation": evaluation.pk, "version": version.number})
    return evaluation


def cancel_evaluation(*, actor: Actor, evaluation: WorkflowEvalRun) -> WorkflowEvalRun:
    return evaluations.stop(actor=actor, evaluation=evaluation, subject=evaluation.workflow, task_name=EVALUATE_TASK,
                           audit_action="workflow.evaluation.cancel")


def active_evaluations(workspace_id: int) -> int:
    """The workspace's workflow evaluations queued or running (its job limit)."""
    return WorkflowEvalRun.objects.filter(workflow__workspace_id=workspace_id,
                                          status__in=[EvalStatus.QUEUED, EvalStatus.RUNNING]).count()
