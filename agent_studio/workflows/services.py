"""Workflows' writes and rules: save (every change a new version, checked first), delete, start a run (queued on
the interactive line), cancel. Plain arguments, typed errors."""

import json

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from agent_studio import events
from agent_studio.models import FINAL_RUN_STATES, RunStatus
from agent_studio.workflows.graph import check_graph
from agent_studio.workflows.models import Workflow, WorkflowRun, WorkflowVersion
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


@transaction.atomic
def save_workflow(*, actor: Actor, workspace: Workspace, workflow: Workflow | None = None, name: str, graph,
                  description: str = "") -> Workflow:
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    name = (name or "").strip()
    if not name or len(name) > 64:
        raise ValidationFailed("A workflow needs a name of at most 64 characters.", fields={"name": ["Required."]})
    checked = check_graph(workspace=workspace, raw=graph)
    try:
        with transaction.atomic():
            workflow = workflow or Workflow(workspace=workspace, created_by=actor.user)
            changed = workflow.graph != checked or workflow.version == 0
            workflow.name, workflow.description, workflow.graph = name, (description or "")[:500], checked
            if changed:
                workflow.version += 1
            workflow.save()
    except IntegrityError:
        raise Conflict(f"This workspace already has a workflow called '{name}'.", fields={"name": ["Taken."]})
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
        raise Conflict(f"'{workflow.name}' has {unfinished} unfinished run(s); wait for them or cancel them first.")
    record_audit(actor=actor, workspace=workflow.workspace, action="workflow.delete", target=workflow,
                 detail={"name": workflow.name})
    forget_asset(workspace=workflow.workspace, kind=AssetKind.WORKFLOW, ref_id=workflow.pk)
    workflow.delete()


def workflow_version(workflow: Workflow, number: int | None = None) -> WorkflowVersion:
    version = workflow.versions.filter(number=number).first() if number else workflow.versions.first()
    if version is None:
        raise ValidationFailed(f"'{workflow.name}' has no version {number}.", fields={"version": ["Unknown."]})
    return version


def clean_inputs(graph: dict, raw) -> dict:
    if not isinstance(raw, dict):
        raise ValidationFailed("'inputs' must be an object of name: value.", fields={"inputs": ["Not an object."]})
    if len(json.dumps(raw, default=str)) > MAX_INPUTS_CHARS:
        raise ValidationFailed(f"'inputs' is larger than {MAX_INPUTS_CHARS} characters.",
                               fields={"inputs": ["Too large."]})
    declared = {item["name"]: item for item in graph["inputs"]}
    if unknown := sorted(set(raw) - set(declared)):
        raise ValidationFailed(f"The workflow has no input {', '.join(unknown)}.", fields={"inputs": unknown})
    cleaned = {}
    for name, item in declared.items():
        value = raw.get(name)
        if value is None:
            if item["required"]:
                raise ValidationFailed(f"The input '{name}' is required.", fields={"inputs": [name]})
        elif isinstance(value, bool) != (item["type"] == "boolean") or not isinstance(value, INPUT_TYPES[item["type"]]):
            raise ValidationFailed(f"The input '{name}' must be a {item['type']}.", fields={"inputs": [name]})
        cleaned[name] = value
    return cleaned


@transaction.atomic
def start_run(*, actor: Actor, workflow: Workflow, inputs, version: WorkflowVersion | None = None,
              caller: str = "api") -> WorkflowRun:
    """Queue a run of the workflow (its latest version unless given) on `inputs`; a worker on the interactive
    line runs it."""
    require_role(actor=actor, workspace=workflow.workspace, role=Role.DEVELOPER)
    version = version or workflow_version(workflow)
    run = WorkflowRun.objects.create(workspace=workflow.workspace, workflow=workflow, workflow_name=workflow.name,
                                     version=version, caller=caller[:64],
                                     inputs=clean_inputs(version.graph, inputs), created_by=actor.user)
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
        raise Conflict(f"The run is already {run.status}.")
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
