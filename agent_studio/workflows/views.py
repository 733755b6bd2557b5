"""Workflows' GUI: the list (create, open, delete) and the canvas of one workflow (static/js/workflow_canvas.js on
the vendored Drawflow library), which saves, validates, runs and follows runs through the REST API
(agent_studio/workflows/api.py). Thin: rules live in agent_studio.workflows.services and graph.py."""

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.errors import ApplicationError, in_request_language
from accounts.gui import gui_actor, has_role, workspace_page
from accounts.models import Role
from agent_studio import selectors as agent_selectors
from agent_studio.workflows import catalog, graph, kinds, selectors, services
from agent_studio.workflows.checks import ELSE
from rag_studio.models import KnowledgeBase
from serving.selectors import chat_model_names
from workbridge.models import Tool

# A new workflow's graph: one input wired straight to the answer, for the user to build on.
STARTER_GRAPH = {"inputs": [{"name": "question", "type": "string", "required": True}],
                 "nodes": [{"id": "start", "kind": "start"},
                           {"id": "answer", "kind": "answer", "settings": {"answer": "{{start.question}}"}}],
                 "edges": [{"from": "start", "to": "answer"}]}


def _workflow(request, workflow_id: int):
    workflow = selectors.workflows(workspace=request.workspace).filter(pk=workflow_id).first()
    if workflow is None:
        raise Http404("No such workflow in this workspace.")
    return workflow


def _template_form(request, chosen: dict | None) -> dict:
    """What the "from a template" forms offer: each template with its slots, the assets a slot can take, and on
    the template just refused what was entered and why."""
    workspace = request.workspace
    templates = catalog.listing()
    for template in templates:
        kept = chosen if chosen and chosen["key"] == template["key"] else {"bindings": {}}
        template["name_value"], template["error"] = kept.get("name", ""), kept.get("error", "")
        for binding in template["bindings"]:
            binding["value"] = str(kept["bindings"].get(binding["slot"], ""))
    return {"templates": templates, "models": chat_model_names(workspace=workspace),
            "knowledge_bases": KnowledgeBase.objects.filter(workspace=workspace).order_by("name"),
            "tools": Tool.objects.filter(workspace=workspace).order_by("name")}


def _from_template(request):
    """A workflow from the template the form names, its slots bound to the assets picked; a refusal is shown
    beside the form with what was entered kept."""
    key = request.POST.get("template", "")
    spec = catalog.templates().get(key, {"bindings": {}})
    bindings = {}
    for slot, slot_spec in spec["bindings"].items():
        value = request.POST.get(f"binding-{slot}", "").strip()
        if value:
            bindings[slot] = int(value) if slot_spec["kind"] != "model" and value.isdigit() else value
    try:
        workflow = catalog.create_from_template(actor=gui_actor(request), workspace=request.workspace, key=key,
                                                name=request.POST.get("name", ""), bindings=bindings)
    except ApplicationError as exc:
        return None, {"key": key, "name": request.POST.get("name", ""), "bindings": bindings,
                      "error": in_request_language(exc.message)}
    messages.success(request, _("Created %(name)s from the template, with its scenarios: run it from the canvas.")
                     % {"name": workflow.name})
    return workflow, None


@workspace_page
def workflows_home(request):
    chosen = None
    if request.method == "POST" and "template" in request.POST:
        workflow, chosen = _from_template(request)
        if workflow is not None:
            return redirect("workflow", workflow_id=workflow.pk)
    elif request.method == "POST":
        workflow = services.save_workflow(actor=gui_actor(request), workspace=request.workspace,
                                          name=request.POST.get("name", ""), graph=STARTER_GRAPH,
                                          description=request.POST.get("description", ""))
        messages.success(request, _("Created %(name)s: add nodes from the palette and wire them.")
                         % {"name": workflow.name})
        return redirect("workflow", workflow_id=workflow.pk)
    workflows = selectors.workflows(workspace=request.workspace)
    can_edit = has_role(request, Role.DEVELOPER)
    return render(request, "workflows/list.html", {
        "workflows": [(workflow, len(workflow.graph.get("nodes", []))) for workflow in workflows],
        "can_edit": can_edit, "from_template": _template_form(request, chosen) if can_edit else None, "chosen": chosen},
        status=400 if chosen else 200)


@workspace_page
@require_POST
def workflow_delete(request, workflow_id: int):
    workflow = _workflow(request, workflow_id)
    services.delete_workflow(actor=gui_actor(request), workflow=workflow)
    messages.success(request, _("Deleted %(name)s; its finished runs are kept.") % {"name": workflow.name})
    return redirect("workflows")


@workspace_page
def workflow_canvas(request, workflow_id: int):
    workflow = _workflow(request, workflow_id)
    workspace = request.workspace
    # What the canvas needs to know of each kind of node, in the palette's order, and what the side panel's pickers
    # offer.
    catalogue = {
        "kinds": {name: kind.canvas() for name, kind in kinds.KINDS.items()},
        "rule_ops": sorted(kinds.RULE_OPS), "input_types": sorted(graph.INPUT_TYPES),
        "http_methods": sorted(kinds.HTTP_METHODS), "policies": sorted(graph.POLICIES), "else": ELSE,
        "models": chat_model_names(workspace=workspace),
        "knowledge_bases": [{"id": kb.pk, "name": kb.name} for kb in KnowledgeBase.objects.filter(workspace=workspace)],
        "tools": [{"id": tool.pk, "name": tool.name, "parameters": sorted(tool.parameters.get("properties", {}))}
                  for tool in Tool.objects.filter(workspace=workspace)],
        "agents": [{"id": agent.pk, "name": agent.name} for agent in agent_selectors.agents(workspace=workspace)],
    }
    return render(request, "workflows/canvas.html", {
        "workflow": workflow, "can_edit": has_role(request, Role.DEVELOPER),
        "canvas": {"id": workflow.pk, "name": workflow.name, "description": workflow.description,
                   "version": workflow.version, "graph": workflow.graph, "layout": workflow.layout,
                   "catalogue": catalogue}})
