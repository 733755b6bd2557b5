"""An agent's settings: what each key means, its default, and the check that refuses what cannot run (a 400 that
names the field). One version's settings are everything a run needs; nothing else about the agent is read.

    {"template": "tool_calling" | "plan_execute" | "team",
     "system_prompt": "You help {customer_name} with orders.",   # {variable} placeholders
     "model": "smollm2-135m-instruct",                            # a chat deployment on the gateway
     "tool_strategy": "native" | "json" | "react_text",
     "tools": [Work Bridge tool ids], "knowledge_bases": [knowledge base ids],
     "sub_agents": [agent ids],                                   # team only: tool-calling agents
     "memory": {"short_term": "window" | "summary", "window_messages": 20, "long_term": false},
     "variables": [{"name", "type": "string"|"number"|"boolean"|"json", "scope": "conversation"|"end_user"|"app",
                    "default", "description"}],
     "limits": {"max_steps": 12, "max_tool_calls": 8, "timeout_s": 180, "max_tokens": 512},
     "generation": {"temperature": 0.2},
     "planning": {"approval": "required" | "auto", "max_plan_steps": 6, "replan": false}}
"""

import re

from django.utils.translation import get_language

from accounts.errors import ValidationFailed
from accounts.models import Workspace
from agent_studio.models import AgentTemplate, ToolStrategy, VariableScope
from rag_studio.models import KnowledgeBase
from serving.selectors import chat_model_problem
from workbridge.models import Tool

VARIABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
VARIABLE_TYPES = {"string": str, "number": (int, float), "boolean": bool, "json": object}
MAX_VARIABLES = 32
MAX_PLAN_STEPS = 20
MAX_PROMPT_CHARS = 20_000
LIMIT_RANGES = {"max_steps": (1, 100), "max_tool_calls": (0, 100), "timeout_s": (5, 3600), "max_tokens": (16, 8192)}

# An agent's instructions until its maker writes their own, in the maker's language: the English and the Chinese
# side by side.
DEFAULT_SYSTEM_PROMPTS = {
    "en": "You are a helpful assistant. Use the tools when they help; answer briefly.",
    "zh-hans": "你是一个乐于助人的助手。工具有帮助时就使用工具；用简体中文简短地回答。",
}
DEFAULTS = {
    "system_prompt": DEFAULT_SYSTEM_PROMPTS["en"],
    "tool_strategy": ToolStrategy.NATIVE,
    "tools": [], "knowledge_bases": [], "sub_agents": [],
    "memory": {"short_term": "window", "window_messages": 20, "long_term": False},
    "variables": [],
    "limits": {"max_steps": 12, "max_tool_calls": 8, "timeout_s": 180, "max_tokens": 512},
    "generation": {"temperature": 0.2},
    "planning": {"approval": "required", "max_plan_steps": 6, "replan": False},
}


def defaults() -> dict:
    """The settings an agent made now starts with: the system prompt in the active language (the user's)."""
    chinese = (get_language() or "").lower().startswith("zh")
    return {**DEFAULTS, "system_prompt": DEFAULT_SYSTEM_PROMPTS["zh-hans" if chinese else "en"]}


# What each setting is, for GET /api/agents/templates/: (JSON type, meaning).
SETTINGS = {
    "system_prompt": ("string", "The agent's instructions; {name} placeholders are filled with its variables."),
    "model": ("string", "A chat deployment on the gateway (or a model group) that the agent runs on."),
    "tool_strategy": ("string", "How the model calls tools: native (OpenAI tools through the gateway), json (a "
                                "reply held to a JSON schema) or react_text (Thought / Action / Observation)."),
    "tools": ("array", "Ids of the workspace's Work Bridge tools the agent may call."),
    "knowledge_bases": ("array", "Ids of the workspace's knowledge bases, each searched through a search_<name> "
                                 "tool whose passages the answer cites."),
    "sub_agents": ("array", "Ids of the workspace's tool-calling agents that the supervisor gives tasks to (at "
                            "least one)."),
    "memory": ("object", "short_term: window (the last window_messages messages) or summary (older ones "
                         "summarised); long_term: save_memory and search_memories tools, per end user."),
    "variables": ("array", "Named memory variables: {name, type: string|number|boolean|json, scope: "
                           "conversation|end_user|app, default, description}, read in the prompt and written by "
                           "the agent."),
    "limits": ("object", "max_steps (model calls), max_tool_calls, timeout_s and max_tokens (per reply) of a run."),
    "generation": ("object", "temperature, from 0 to 2."),
    "planning": ("object", "approval: required (the run pauses for the plan to be edited and approved) or auto; "
                           "max_plan_steps; replan: revise the remaining steps after each one."),
}
_EVERY_TEMPLATE = ("system_prompt", "model", "tool_strategy", "tools", "knowledge_bases", "memory", "variables",
                   "limits", "generation")
# Each template: what it does, the settings it reads and those it cannot run without.
TEMPLATES = {
    AgentTemplate.TOOL_CALLING: (
        "The model calls the agent's tools until it has what it needs, then writes the answer from their results "
        "with no tools offered.", _EVERY_TEMPLATE, ("model",)),
    AgentTemplate.PLAN_EXECUTE: (
        "A planner writes the steps; the run pauses so that the plan can be edited and approved (unless approval "
        "is auto), a tool-calling executor carries out each step, and the answer is written from the steps' "
        "results.", (*_EVERY_TEMPLATE, "planning"), ("model",)),
    AgentTemplate.TEAM: (
        "A supervisor gives each part of the task to the team member (another tool-calling agent of the "
        "workspace, with its own tools, prompt and memory) best suited to it, and answers from what they return.",
        (*_EVERY_TEMPLATE, "sub_agents"), ("model", "sub_agents")),
}


def _refuse(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, fields={field: [message]})


def _ids(value, field: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise _refuse(field, f"'{field}' must be a list of ids.")
    return list(dict.fromkeys(value))


def _merged(defaults: dict, given, field: str) -> dict:
    if given is None:
        return dict(defaults)
    if not isinstance(given, dict):
        raise _refuse(field, f"'{field}' must be an object.")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise _refuse(field, f"'{field}' has no setting {', '.join(unknown)}; it has {', '.join(sorted(defaults))}.")
    return {**defaults, **given}


def _int_in(value, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _refuse(field, f"'{field}' must be a whole number from {low} to {high}.")
    return value


def check_variables(value) -> list[dict]:
    if not isinstance(value, list) or len(value) > MAX_VARIABLES:
        raise _refuse("variables", f"'variables' must be a list of at most {MAX_VARIABLES} definitions.")
    checked, names = [], set()
    for index, definition in enumerate(value):
        field = f"variables[{index}]"
        if not isinstance(definition, dict):
            raise _refuse(field, f"{field} must be an object.")
        name = definition.get("name")
        if not isinstance(name, str) or not VARIABLE_NAME.fullmatch(name) or name in names:
            raise _refuse(field, f"{field}.name must be a unique name of letters, digits and '_'.")
        kind = definition.get("type", "string")
        if kind not in VARIABLE_TYPES:
            raise _refuse(field, f"{field}.type must be one of {', '.join(VARIABLE_TYPES)}.")
        scope = definition.get("scope", VariableScope.CONVERSATION)
        if scope not in VariableScope.values:
            raise _refuse(field, f"{field}.scope must be one of {', '.join(VariableScope.values)}.")
        default = definition.get("default")
        if default is not None and not fits_type(default, kind):
            raise _refuse(field, f"{field}.default is not a {kind}.")
        names.add(name)
        checked.append({"name": name, "type": kind, "scope": scope, "default": default,
                        "description": str(definition.get("description", ""))[:300]})
    return checked


def fits_type(value, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, VARIABLE_TYPES[kind])


def check_plan(plan, *, limit: int = MAX_PLAN_STEPS) -> list[str]:
    """A plan as the user edited it: one to `limit` steps, each a non-empty sentence."""
    if not isinstance(plan, list) or not plan:
        raise _refuse("plan", "The plan needs at least one step.")
    if len(plan) > limit:
        raise _refuse("plan", f"The plan has {len(plan)} steps; at most {limit} are allowed.")
    steps = []
    for index, step in enumerate(plan):
        if not isinstance(step, str) or not step.strip() or len(step) > 500:
            raise _refuse("plan", f"Step {index + 1} must be a sentence of 1 to 500 characters.")
        steps.append(step.strip())
    return steps


def check_settings(*, workspace: Workspace, template: str, raw: dict, agent_id: int | None = None) -> dict:
    """The settings as stored, defaults filled in, or a ValidationFailed naming what cannot run."""
    if template not in AgentTemplate.values:
        raise _refuse("template", f"'template' must be one of {', '.join(AgentTemplate.values)}.")
    if not isinstance(raw, dict):
        raise _refuse("settings", "'settings' must be an object.")
    unknown = sorted(set(raw) - set(DEFAULTS) - {"model", "template"})
    if unknown:
        raise _refuse("settings", f"Unknown settings: {', '.join(unknown)}.")
    value = {**defaults(), **raw, "template": template}
    prompt = value["system_prompt"]
    if not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS:
        raise _refuse("system_prompt", f"'system_prompt' must be text of at most {MAX_PROMPT_CHARS} characters.")
    model = value.get("model")
    if problem := chat_model_problem(workspace=workspace, name=model):
        raise _refuse("model", problem)
    if value["tool_strategy"] not in ToolStrategy.values:
        raise _refuse("tool_strategy", f"'tool_strategy' must be one of {', '.join(ToolStrategy.values)}.")

    tools = _ids(value["tools"], "tools")
    found = set(Tool.objects.filter(workspace=workspace, pk__in=tools).values_list("pk", flat=True))
    if missing := [pk for pk in tools if pk not in found]:
        raise _refuse("tools", f"This workspace has no tool {', '.join(map(str, missing))}.")
    kbs = _ids(value["knowledge_bases"], "knowledge_bases")
    found = set(KnowledgeBase.objects.filter(workspace=workspace, pk__in=kbs).values_list("pk", flat=True))
    if missing := [pk for pk in kbs if pk not in found]:
        raise _refuse("knowledge_bases", f"This workspace has no knowledge base {', '.join(map(str, missing))}.")
    sub_agents = _ids(value["sub_agents"], "sub_agents")
    if sub_agents and template != AgentTemplate.TEAM:
        raise _refuse("sub_agents", "Only a team agent has sub-agents.")
    if template == AgentTemplate.TEAM:
        _check_sub_agents(workspace, sub_agents, agent_id)

    memory = _merged(DEFAULTS["memory"], value["memory"], "memory")
    if memory["short_term"] not in ("window", "summary"):
        raise _refuse("memory", "'memory.short_term' must be 'window' or 'summary'.")
    memory["window_messages"] = _int_in(memory["window_messages"], "memory.window_messages", 2, 200)
    memory["long_term"] = bool(memory["long_term"])
    limits = _merged(DEFAULTS["limits"], value["limits"], "limits")
    for name, (low, high) in LIMIT_RANGES.items():
        limits[name] = _int_in(limits[name], f"limits.{name}", low, high)
    generation = _merged(DEFAULTS["generation"], value["generation"], "generation")
    temperature = generation["temperature"]
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise _refuse("generation", "'generation.temperature' must be a number from 0 to 2.")
    planning = _merged(DEFAULTS["planning"], value["planning"], "planning")
    if planning["approval"] not in ("required", "auto"):
        raise _refuse("planning", "'planning.approval' must be 'required' or 'auto'.")
    planning["max_plan_steps"] = _int_in(planning["max_plan_steps"], "planning.max_plan_steps", 1, MAX_PLAN_STEPS)
    planning["replan"] = bool(planning["replan"])
    return {"template": template, "system_prompt": prompt, "model": model, "tool_strategy": value["tool_strategy"],
            "tools": tools, "knowledge_bases": kbs, "sub_agents": sub_agents, "memory": memory,
            "variables": check_variables(value["variables"]), "limits": limits,
            "generation": {"temperature": float(temperature)}, "planning": planning}


def _check_sub_agents(workspace: Workspace, sub_agents: list[int], agent_id: int | None) -> None:
    from agent_studio.models import Agent

    if not sub_agents:
        raise _refuse("sub_agents", "A team needs at least one sub-agent.")
    if agent_id in sub_agents:
        raise _refuse("sub_agents", "A team cannot be its own sub-agent.")
    found = {agent.pk: agent for agent in Agent.objects.filter(workspace=workspace, pk__in=sub_agents)}
    if missing := [pk for pk in sub_agents if pk not in found]:
        raise _refuse("sub_agents", f"This workspace has no agent {', '.join(map(str, missing))}.")
    if nested := [agent.name for agent in found.values() if agent.template != AgentTemplate.TOOL_CALLING]:
        raise _refuse("sub_agents", f"Sub-agents must be tool-calling assistants; {', '.join(nested)} is not.")
