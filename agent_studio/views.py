"""Agent Studio's GUI: agents from templates, the builder (model, tools, knowledge bases, sub-agents, memory and
variables, prompts, limits), the debug chat with its live step trace and plan editor (static/js/agents.js, over the
REST API), versions, scenarios and evaluation reports. Thin: rules live in agent_studio.services."""

import json
import uuid

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.errors import ValidationFailed
from accounts.gui import gui_actor, workspace_page
from agent_studio import config, demo, probes, selectors, services
from agent_studio.models import AgentTemplate, ToolStrategy, VariableScope
from agent_studio.runs.fields import EvalStatus
from agent_studio.strategies import probe
from cluster import queues
from rag_studio.models import KnowledgeBase
from serving.selectors import chat_model_names
from workbridge.models import Tool


def _agent(request, agent_id: int):
    agent = selectors.agents(workspace=request.workspace).filter(pk=agent_id).first()
    if agent is None:
        raise Http404("No such agent in this workspace.")
    return agent


def _chat_deployments(workspace) -> list[str]:
    return chat_model_names(workspace=workspace)


def _int(post, field: str, label: str) -> int:
    try:
        return int(post.get(field, ""))
    except ValueError:
        raise ValidationFailed(_("%(label)s must be a whole number.") % {"label": label})


def _ids(post, field: str) -> list[int]:
    return [int(value) for value in post.getlist(field) if value.isdigit()]


def _variables(post) -> list[dict]:
    """The variables table: one row per name; a row whose name is blank is dropped."""
    rows = []
    for index, name in enumerate(post.getlist("var_name")):
        if not name.strip():
            continue
        kind = post.getlist("var_type")[index]
        default_text = post.getlist("var_default")[index].strip()
        default = None
        if default_text:
            try:
                default = default_text if kind == "string" else json.loads(default_text)
            except ValueError:
                raise ValidationFailed(_("The default of %(name)s is not a %(kind)s.") % {"name": name, "kind": kind})
        rows.append({"name": name.strip(), "type": kind, "scope": post.getlist("var_scope")[index],
                     "default": default, "description": post.getlist("var_description")[index]})
    return rows


def _settings_from(post, template: str) -> dict:
    settings = {
        "system_prompt": post.get("system_prompt", ""), "model": post.get("model", ""),
        "tool_strategy": post.get("tool_strategy", ToolStrategy.NATIVE),
        "tools": _ids(post, "tools"), "knowledge_bases": _ids(post, "knowledge_bases"),
        "memory": {"short_term": post.get("short_term", "window"),
                   "window_messages": _int(post, "window_messages", _("Window")),
                   "long_term": post.get("long_term") == "on"},
        "variables": _variables(post),
        "limits": {name: _int(post, name, label) for name, label in (
            ("max_steps", _("Max model calls")), ("max_tool_calls", _("Max tool calls")),
            ("timeout_s", _("Timeout")), ("max_tokens", _("Max tokens")))},
        "planning": {"approval": post.get("approval", "required"),
                     "max_plan_steps": _int(post, "max_plan_steps", _("Max plan steps")),
                     "replan": post.get("replan") == "on"},
    }
    try:
        settings["generation"] = {"temperature": float(post.get("temperature", "0.2"))}
    except ValueError:
        raise ValidationFailed(_("The temperature must be a number."))
    if template == AgentTemplate.TEAM:
        settings["sub_agents"] = _ids(post, "sub_agents")
    return settings


@workspace_page
def agents_home(request):
    if request.method == "POST" and request.POST.get("action") == "demo":
        agent = demo.create_demo_agent(actor=gui_actor(request), workspace=request.workspace,
                                       model=request.POST.get("model", ""))
        messages.success(request, _("Created the demo agent %(name)s, its tool and its scenarios.")
                         % {"name": agent.name})
        return redirect("agent", agent_id=agent.pk)
    if request.method == "POST":
        template = request.POST.get("template", AgentTemplate.TOOL_CALLING)
        agent = services.save_agent(actor=gui_actor(request), workspace=request.workspace,
                                    name=request.POST.get("name", ""), template=template,
                                    description=request.POST.get("description", ""),
                                    settings={"model": request.POST.get("model", "")} | (
                                        {"sub_agents": _ids(request.POST, "sub_agents")}
                                        if template == AgentTemplate.TEAM else {}))
        messages.success(request, _("Created %(name)s from the %(template)s template.")
                         % {"name": agent.name, "template": agent.get_template_display()})
        return redirect("agent", agent_id=agent.pk)
    agents = selectors.agents_with_counts(workspace=request.workspace)
    return render(request, "agents/home.html", {
        "agents": agents, "templates": AgentTemplate.choices,
        "deployments": _chat_deployments(request.workspace),
        "members": [agent for agent in agents if agent.template == AgentTemplate.TOOL_CALLING]})


@workspace_page
def agent_page(request, agent_id: int):
    agent = _agent(request, agent_id)
    suggestion = None
    if request.method == "POST" and request.POST.get("action") == "suggest":
        services.require_developer(actor=gui_actor(request), agent=agent)
        suggestion = probe(workspace_id=agent.workspace_id, model=agent.settings["model"])
    elif request.method == "POST":
        agent = services.save_agent(actor=gui_actor(request), workspace=request.workspace, agent=agent,
                                    name=request.POST.get("name", agent.name), template=agent.template,
                                    description=request.POST.get("description", ""),
                                    settings=_settings_from(request.POST, agent.template))
        messages.success(request, _("Saved %(name)s: version %(version)s.") % {"name": agent.name,
                                                                              "version": agent.version})
        return redirect("agent", agent_id=agent.pk)
    settings = agent.settings
    return render(request, "agents/agent.html", {
        "agent": agent, "settings": settings, "suggestion": suggestion,
        "deployments": _chat_deployments(request.workspace), "strategies": ToolStrategy.choices,
        "tools": Tool.objects.filter(workspace=request.workspace),
        "knowledge_bases": KnowledgeBase.objects.filter(workspace=request.workspace),
        "members": selectors.agents(workspace=request.workspace).filter(template=AgentTemplate.TOOL_CALLING)
        .exclude(pk=agent.pk),
        "variable_rows": [*settings.get("variables", []), {"name": "", "type": "string",
                                                           "scope": VariableScope.CONVERSATION}],
        "variable_types": list(config.VARIABLE_TYPES), "scopes": VariableScope.choices,
        "versions": agent.versions.all()[:20], "run_count": agent.runs.count(),
        "is_plan": agent.template == AgentTemplate.PLAN_EXECUTE,
        "is_team": agent.template == AgentTemplate.TEAM})


@workspace_page
@require_POST
def agent_delete(request, agent_id: int):
    agent = _agent(request, agent_id)
    runs = request.POST.get("runs", "")
    services.delete_agent(actor=gui_actor(request), agent=agent, runs=runs)
    if runs == "keep":
        messages.success(request, _("Deleted %(name)s; its runs are kept.") % {"name": agent.name})
    else:
        messages.success(request, _("Deleted %(name)s and its runs.") % {"name": agent.name})
    return redirect("agents")


@workspace_page
def agent_chat(request, agent_id: int):
    agent = _agent(request, agent_id)
    recent = selectors.runs(workspace=request.workspace).filter(agent=agent)[:10]
    return render(request, "agents/chat.html", {"agent": agent, "recent": recent,
                                                "is_plan": agent.template == AgentTemplate.PLAN_EXECUTE})


@workspace_page
def agent_evaluation(request, agent_id: int):
    agent = _agent(request, agent_id)
    if request.method == "POST" and request.POST.get("action") == "scenario":
        post = request.POST
        checks = [{"kind": kind, "value": post.get(f"check_{kind}", "").strip()}
                  for kind in ("contains", "regex") if post.get(f"check_{kind}", "").strip()]
        expected = [{"name": name.strip()} for name in post.get("expected_tools", "").split(",") if name.strip()]
        services.save_scenario(actor=gui_actor(request), agent=agent, name=post.get("name", ""),
                               input=post.get("input", ""), checks=checks, expected_tools=expected,
                               tools_in_order=post.get("tools_in_order") == "on",
                               forbidden_tools=[n.strip() for n in post.get("forbidden_tools", "").split(",")
                                                if n.strip()])
        messages.success(request, _("Added the scenario."))
        return redirect("agent-evaluation", agent_id=agent.pk)
    if request.method == "POST":
        evaluation = services.start_evaluation(actor=gui_actor(request), agent=agent,
                                               include_safety=request.POST.get("include_safety") == "on")
        messages.success(request, _("Evaluating version %(version)s.") % {"version": evaluation.version.number})
        return redirect("agent-evaluation-report", evaluation_id=evaluation.pk)
    runs = list(agent.eval_runs.select_related("version")[:20])
    compared = [run for run in runs if str(run.pk) in request.GET.getlist("compare")] or \
        [run for run in runs if run.status == EvalStatus.DONE][:2]
    return render(request, "agents/evaluation.html", {
        "agent": agent, "scenarios": agent.scenarios.all(), "runs": runs, "compared": compared,
        "categories": probes.CATEGORIES})


@workspace_page
def evaluation_report(request, evaluation_id: int):
    evaluation = selectors.eval_runs(workspace=request.workspace).filter(pk=evaluation_id).first()
    if evaluation is None:
        raise Http404("No such evaluation.")
    if request.method == "POST" and request.POST.get("action") == "cancel_evaluation":
        services.cancel_evaluation(actor=gui_actor(request), evaluation=evaluation)
        messages.success(request, _("Cancelled; the results so far are kept."))
        return redirect("agent-evaluation-report", evaluation_id=evaluation.pk)
    place = services.evaluation_place(queues.interactive_line(), evaluation)
    results = _with_run_links(request, evaluation)
    return render(request, "agents/report.html", {
        "evaluation": evaluation, "agent": evaluation.agent, "categories": probes.CATEGORIES,
        "running": evaluation.status in (EvalStatus.QUEUED, EvalStatus.RUNNING),
        "place": place.as_dict() if place else None,
        "scenarios": [item for item in results if item["type"] == "scenario"],
        "probes": [item for item in results if item["type"] == "probe"]})


def _with_run_links(request, evaluation) -> list[dict]:
    """The evaluation's results, each with `run_url`: the page of the run that produced it (its steps say why a
    case failed), where that run is still kept."""
    kept = {str(public_id) for public_id in selectors.runs(workspace=request.workspace).filter(
        public_id__in=[item["run_id"] for item in evaluation.results if _is_uuid(item.get("run_id"))]
    ).values_list("public_id", flat=True)}
    return [item | {"run_url": f"{reverse('agent-run', args=[item['run_id']])}?evaluation={evaluation.pk}"
                    if item.get("run_id") in kept else ""} for item in evaluation.results]


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


@workspace_page
def run_page(request, run_id):
    """One agent run: its input, answer or error, and every step it took; an evaluation report links each case's
    run here (`?evaluation=` leads back to that report)."""
    run = selectors.runs(workspace=request.workspace).filter(public_id=run_id).select_related(
        "agent", "version").first()
    if run is None:
        raise Http404("No such run in this workspace.")
    evaluation_id = request.GET.get("evaluation", "")
    evaluation = (selectors.eval_runs(workspace=request.workspace).filter(pk=evaluation_id).first()
                  if evaluation_id.isdigit() else None)
    return render(request, "agents/run.html", {"run": run, "steps": selectors.run_steps(run),
                                               "evaluation": evaluation})


@workspace_page
def evaluation_export(request, evaluation_id: int):
    from agent_studio.api import EvalRunSerializer

    evaluation = selectors.eval_runs(workspace=request.workspace).filter(pk=evaluation_id).first()
    if evaluation is None:
        raise Http404("No such evaluation.")
    response = HttpResponse(json.dumps(EvalRunSerializer(evaluation).data, ensure_ascii=False, indent=2, default=str),
                            content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="evaluation-{evaluation.pk}.json"'
    return response
