"""Agent Studio's writes and rules: agents and their versions, runs (start, approve a plan, cancel), conversation
variables, evaluation scenarios and runs. Every function takes plain arguments and raises typed errors."""

import re
import uuid

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone
from django.utils.translation import gettext as _

from accounts.errors import Conflict, NotFound, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from agent_studio import config, events, memory
from agent_studio.models import (
    Agent,
    AgentEvalRun,
    AgentRun,
    AgentThread,
    AgentVersion,
    Scenario,
    ThreadSource,
)
from agent_studio.runs import evaluations
from agent_studio.runs.fields import FINAL_RUN_STATES, EvalStatus, RunStatus
from assets.models import AssetKind
from assets.services import forget_asset, payload_checksum, register_asset
from cluster import queues

MAX_INPUT_CHARS = 8000
MAX_END_USER_CHARS = 128
SCENARIO_CHECK_KINDS = {"contains", "not_contains", "regex", "json_field", "judge"}
# The tasks of agent_studio/tasks.py, sent by name: that module runs what these services queue.
EXECUTE_TASK = "agent_studio.tasks.execute_run"
EVALUATE_TASK = "agent_studio.tasks.run_evaluation"
# What becomes of an agent's runs when it is deleted.
RUN_CHOICES = ("keep", "delete")


def _dispatch_run(run: AgentRun, resume=None) -> None:
    transaction.on_commit(lambda: queues.send(EXECUTE_TASK, [run.pk, resume], queue=settings.AGENT_QUEUE,
                                              workspace_id=run.workspace_id))


@transaction.atomic
def save_agent(*, actor: Actor, workspace: Workspace, agent: Agent | None = None, name: str, template: str,
               settings: dict, description: str = "") -> Agent:
    """Create or change an agent. A save that changes its settings writes the next version; runs, evaluations and
    published apps keep the version they were given."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    name = (name or "").strip()
    if not name or len(name) > 64:
        raise ValidationFailed("An agent needs a name of at most 64 characters.", fields={"name": ["Required."]})
    if agent is not None and agent.template != template and agent.runs.exists():
        raise ValidationFailed("An agent keeps its template once it has run; create a new agent for another one.",
                               fields={"template": ["Cannot change."]})
    checked = config.check_settings(workspace=workspace, template=template, raw=settings,
                                    agent_id=agent.pk if agent else None)
    try:
        with transaction.atomic():
            agent = agent or Agent(workspace=workspace, created_by=actor.user)
            agent.name, agent.template, agent.description = name, template, (description or "")[:500]
            changed = agent.settings != checked or agent.version == 0
            agent.settings = checked
            if changed:
                agent.version += 1
            agent.save()
    except IntegrityError:
        raise Conflict(_("This workspace already has an agent called '%(name)s'.") % {"name": name},
                       fields={"name": ["Taken."]})
    if changed:
        AgentVersion.objects.create(agent=agent, number=agent.version, settings=checked,
                                    checksum=payload_checksum(checked))
    register_asset(workspace=workspace, kind=AssetKind.AGENT, ref_id=agent.pk, name=agent.name, payload=checked,
                   actor=actor, summary={"version": agent.version, "template": template, "model": checked["model"]})
    record_audit(actor=actor, workspace=workspace, action="agent.save", target=agent,
                 detail={"version": agent.version})
    return agent


@transaction.atomic
def delete_agent(*, actor: Actor, agent: Agent, runs: str) -> None:
    """Delete an agent with its versions, conversations, memories, scenarios and evaluations. Its runs go too
    (`runs="delete"`) or stay as the workspace's record of what it did (`runs="keep"`: input, steps, answer and
    usage, under the agent's name). Refused while a published app pins it, a team has it as a member, or one of
    its runs is unfinished."""
    require_role(actor=actor, workspace=agent.workspace, role=Role.DEVELOPER)
    if runs not in RUN_CHOICES:
        raise ValidationFailed("Say what becomes of the agent's runs: 'runs' must be 'keep' or 'delete'.",
                               fields={"runs": ["Choose keep or delete."]})
    teams = [team.name for team in Agent.objects.filter(workspace=agent.workspace).exclude(pk=agent.pk)
             if agent.pk in team.settings.get("sub_agents", [])]
    if teams:
        raise Conflict(_("'%(agent)s' is a member of the team(s) %(teams)s; remove it from them first.")
                       % {"agent": agent.name, "teams": ", ".join(teams)})
    unfinished = agent.runs.exclude(status__in=FINAL_RUN_STATES).count()
    if unfinished:
        raise Conflict(_("'%(name)s' has %(count)d unfinished run(s); wait for them or cancel them first.")
                       % {"name": agent.name, "count": unfinished})
    record_audit(actor=actor, workspace=agent.workspace, action="agent.delete", target=agent,
                 detail={"name": agent.name, "runs": runs})
    forget_asset(workspace=agent.workspace, kind=AssetKind.AGENT, ref_id=agent.pk)
    memory.forget_agent(agent_id=agent.pk, threads=list(agent.threads.all()))
    if runs == "delete":
        agent.runs.all().delete()
    else:
        agent.runs.update(agent_name=agent.name)
    try:
        with transaction.atomic():
            agent.delete()
    except ProtectedError:
        # Runs and evaluations no longer hold an agent's versions; what still does is a published app's release.
        raise Conflict(_("'%(name)s' is published as an app; delete the app first.") % {"name": agent.name})


def require_developer(*, actor: Actor, agent: Agent) -> None:
    require_role(actor=actor, workspace=agent.workspace, role=Role.DEVELOPER)


def agent_version(agent: Agent, number: int | None = None) -> AgentVersion:
    version = agent.versions.filter(number=number).first() if number else agent.versions.first()
    if version is None:
        raise ValidationFailed(_("'%(name)s' has no version %(number)s.") % {"name": agent.name, "number": number},
                               fields={"version": ["Unknown."]})
    return version


def clean_input(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationFailed("'input' must be a non-empty string.", fields={"input": ["Required."]})
    if len(value) > MAX_INPUT_CHARS:
        raise ValidationFailed(_("'input' is %(length)s characters; the limit is %(limit)s.")
                               % {"length": len(value), "limit": MAX_INPUT_CHARS},
                               fields={"input": ["Too long."]})
    return value.strip()


def _thread(agent: Agent, thread_id, end_user: str, source: str) -> AgentThread:
    if thread_id in (None, ""):
        return AgentThread.objects.create(agent=agent, end_user=end_user, source=source)
    try:
        public_id = uuid.UUID(str(thread_id))
    except ValueError:
        public_id = None
    thread = AgentThread.objects.filter(agent=agent, end_user=end_user, public_id=public_id).first() \
        if public_id else None
    if thread is None:
        raise NotFound(_("Conversation '%(thread)s' not found for this user of '%(agent)s'.")
                       % {"thread": thread_id, "agent": agent.name})
    return thread


def conversation_thread(*, agent: Agent, public_id, end_user: str) -> AgentThread:
    """The thread of a published app's conversation, which shares its id; made on the conversation's first turn."""
    thread, _created = AgentThread.objects.get_or_create(public_id=public_id, defaults={
        "agent": agent, "end_user": end_user, "source": ThreadSource.APP})
    if thread.agent_id != agent.pk or thread.end_user != end_user:
        raise NotFound(_("Conversation '%(thread)s' not found for this user of '%(agent)s'.")
                       % {"thread": public_id, "agent": agent.name})
    return thread


@transaction.atomic
def start_run(*, actor: Actor | None, agent: Agent, input, thread_id=None, end_user: str = "",
              source: str = ThreadSource.DEBUG, version: AgentVersion | None = None, caller: str = "debug",
              prior_messages: list | None = None, run_as=None) -> AgentRun:
    """Queue one turn of a conversation (a new one without `thread_id`); a worker runs it. The agent's tools act
    with the rights of `run_as`: the actor, or for a published app (actor None: runtime has authorised the app
    key) the user who published it."""
    if actor is not None:
        require_role(actor=actor, workspace=agent.workspace, role=Role.DEVELOPER)
        run_as = actor.user
    text = clean_input(input)
    if not isinstance(end_user, str) or len(end_user) > MAX_END_USER_CHARS:
        raise ValidationFailed(_("'user' must be a string of at most %(limit)s characters.")
                               % {"limit": MAX_END_USER_CHARS},
                               fields={"user": ["Invalid."]})
    thread = _thread(agent, thread_id, end_user or (run_as.username if run_as else "anonymous"), source)
    busy = thread.runs.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL]).first()
    if busy is not None:
        raise Conflict(_("The conversation is still busy with run %(run)s (%(status)s); wait for it, approve its "
                         "plan or cancel it first.") % {"run": busy.public_id, "status": busy.status})
    run = AgentRun.objects.create(workspace=agent.workspace, agent=agent, version=version or agent_version(agent),
                                  thread=thread, caller=caller[:64], input=text, prior_messages=prior_messages or [],
                                  created_by=run_as)
    AgentThread.objects.filter(pk=thread.pk).update(updated_at=timezone.now())
    events.publish(run.public_id, "status", {"status": RunStatus.QUEUED})
    _dispatch_run(run)
    return run


@transaction.atomic
def approve_plan(*, actor: Actor | None, run: AgentRun, plan) -> AgentRun:
    """Resume a run paused on its plan, with the plan as the user edited it (reordered, shortened, extended)."""
    if actor is not None:
        require_role(actor=actor, workspace=run.workspace, role=Role.DEVELOPER)
    run = AgentRun.objects.select_for_update().get(pk=run.pk)
    if run.status != RunStatus.AWAITING_APPROVAL:
        raise Conflict(_("The run is %(status)s; only a run awaiting approval of its plan can be resumed.")
                       % {"status": run.status})
    steps = config.check_plan(plan)
    run.status, run.plan = RunStatus.QUEUED, steps
    run.save(update_fields=["status", "plan"])
    events.publish(run.public_id, "status", {"status": RunStatus.QUEUED, "plan": steps})
    _dispatch_run(run, {"plan": steps})
    return run


@transaction.atomic
def cancel_run(*, actor: Actor | None, run: AgentRun) -> AgentRun:
    """Stop a run: at once if it is queued or waiting for approval, at its next step if it is running."""
    if actor is not None:
        require_role(actor=actor, workspace=run.workspace, role=Role.DEVELOPER)
    run = AgentRun.objects.select_for_update().get(pk=run.pk)
    if run.finished:
        raise Conflict(_("The run is already %(status)s.") % {"status": run.status})
    run.cancel_requested = True
    fields = ["cancel_requested"]
    if run.status in (RunStatus.QUEUED, RunStatus.AWAITING_APPROVAL):
        run.status, run.error, run.finished_at = RunStatus.CANCELLED, "The run was cancelled.", timezone.now()
        fields += ["status", "error", "finished_at"]
    run.save(update_fields=fields)
    if run.status == RunStatus.CANCELLED:
        from agent_studio.runner import run_payload

        events.publish(run.public_id, "cancelled", run_payload(run))
    return run


def set_thread_variable(*, actor: Actor, thread: AgentThread, name: str, value) -> None:
    """Edit a memory variable as a conversation sees it (GUI or API)."""
    require_role(actor=actor, workspace=thread.agent.workspace, role=Role.DEVELOPER)
    try:
        memory.set_variable(definitions=thread.agent.settings.get("variables", []), thread=thread, name=name,
                            value=value)
    except memory.VariableRefused as exc:
        raise ValidationFailed(str(exc), fields={"name": [str(exc)]})
    record_audit(actor=actor, workspace=thread.agent.workspace, action="agent.variable.set", target=thread.agent,
                 detail={"name": name, "thread": str(thread.public_id)})


def _check_scenario(*, name, input, checks, expected_tools, forbidden_tools, expected_memory, history) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > 120:
        raise ValidationFailed("A scenario needs a name of at most 120 characters.", fields={"name": ["Required."]})
    clean_input(input)
    check_answer_checks(checks)
    if not isinstance(expected_tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("arguments", {}), dict)
            for t in expected_tools):
        raise ValidationFailed("'expected_tools' must be a list of {name, arguments?}.",
                               fields={"expected_tools": ["Invalid."]})
    if not isinstance(forbidden_tools, list) or not all(isinstance(t, str) for t in forbidden_tools):
        raise ValidationFailed("'forbidden_tools' must be a list of tool names.",
                               fields={"forbidden_tools": ["Invalid."]})
    if not isinstance(expected_memory, list) or not all(isinstance(m, dict) and "name" in m for m in expected_memory):
        raise ValidationFailed("'expected_memory' must be a list of {name, value}.",
                               fields={"expected_memory": ["Invalid."]})
    if not isinstance(history, list) or not all(
            isinstance(turn, dict) and turn.get("role") in ("user", "assistant")
            and isinstance(turn.get("content"), str)
            for turn in history):
        raise ValidationFailed("'history' must be a list of {role: user|assistant, content}.",
                               fields={"history": ["Invalid."]})


def check_answer_checks(checks) -> None:
    """A scenario's checks on the answer (an agent's or a workflow's), or the 400 naming the one at fault."""
    if not isinstance(checks, list) or not all(isinstance(c, dict) and c.get("kind") in SCENARIO_CHECK_KINDS
                                               for c in checks):
        raise ValidationFailed(_("'checks' must be a list of {kind, ...} with kind one of %(kinds)s.")
                               % {"kinds": ", ".join(sorted(SCENARIO_CHECK_KINDS))}, fields={"checks": ["Invalid."]})
    for check in checks:
        if check["kind"] in ("contains", "not_contains", "regex", "judge") and not isinstance(check.get("value"), str):
            raise ValidationFailed(_("A '%(kind)s' check needs a text 'value'.") % {"kind": check["kind"]},
                                   fields={"checks": ["Invalid."]})
        if check["kind"] == "json_field" and not isinstance(check.get("path"), str):
            raise ValidationFailed("A 'json_field' check needs a 'path' and a 'value'.",
                                   fields={"checks": ["Invalid."]})
        if check["kind"] == "regex":
            try:
                re.compile(check["value"])
            except re.error as exc:
                raise ValidationFailed(_("The regex '%(regex)s' does not compile: %(error)s.")
                                       % {"regex": check["value"], "error": exc},
                                       fields={"checks": ["Invalid regex."]})


def save_scenario(*, actor: Actor, agent: Agent, scenario: Scenario | None = None, name: str, input: str,
                  checks: list | None = None, expected_tools: list | None = None, tools_in_order: bool = False,
                  forbidden_tools: list | None = None, expected_memory: list | None = None,
                  history: list | None = None) -> Scenario:
    require_role(actor=actor, workspace=agent.workspace, role=Role.DEVELOPER)
    fields = {"name": (name or "").strip(), "input": input, "checks": checks or [],
              "expected_tools": expected_tools or [], "forbidden_tools": forbidden_tools or [],
              "expected_memory": expected_memory or [], "history": history or []}
    _check_scenario(**fields)
    fields["tools_in_order"] = bool(tools_in_order)
    try:
        with transaction.atomic():
            if scenario is None:
                scenario = Scenario.objects.create(agent=agent, **fields)
            else:
                Scenario.objects.filter(pk=scenario.pk).update(**fields)
                scenario.refresh_from_db()
    except IntegrityError:
        raise Conflict(_("'%(agent)s' already has a scenario called '%(name)s'.")
                       % {"agent": agent.name, "name": fields["name"]})
    return scenario


def delete_scenario(*, actor: Actor, scenario: Scenario) -> None:
    require_role(actor=actor, workspace=scenario.agent.workspace, role=Role.DEVELOPER)
    scenario.delete()


@transaction.atomic
def start_evaluation(*, actor: Actor, agent: Agent, version_number: int | None = None,
                     include_safety: bool = True) -> AgentEvalRun:
    """Score a version on the agent's scenarios and, unless told not to, on the shipped safety probes."""
    require_role(actor=actor, workspace=agent.workspace, role=Role.DEVELOPER)
    if not agent.scenarios.exists() and not include_safety:
        raise ValidationFailed("Add a scenario first, or include the safety probes.",
                               fields={"scenarios": ["None yet."]})
    queues.check_job_limit(agent.workspace_id)
    return evaluations.queue(AgentEvalRun, EVALUATE_TASK, workspace_id=agent.workspace_id, agent=agent,
                            version=agent_version(agent, version_number), include_safety=bool(include_safety),
                            created_by=actor.user)


def cancel_evaluation(*, actor: Actor, evaluation: AgentEvalRun) -> AgentEvalRun:
    return evaluations.stop(actor=actor, evaluation=evaluation, subject=evaluation.agent, task_name=EVALUATE_TASK,
                             audit_action="agent.evaluation.cancel")


def active_evaluations(workspace_id: int) -> int:
    """The workspace's agent evaluations queued or running (its job limit)."""
    return AgentEvalRun.objects.filter(agent__workspace_id=workspace_id,
                                       status__in=[EvalStatus.QUEUED, EvalStatus.RUNNING]).count()


def evaluation_place(line: queues.Line, evaluation: AgentEvalRun) -> queues.Place | None:
    """Where a queued evaluation stands in the interactive line."""
    if evaluation.status != EvalStatus.QUEUED:
        return None
    return line.place(EVALUATE_TASK, [evaluation.pk], workspace_id=evaluation.agent.workspace_id,
                      default_s=300.0, reason=_("waiting for the interactive worker (evaluations, tuning, "
                                                "calibration)"))
