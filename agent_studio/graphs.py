"""The agent templates, each a LangGraph graph built from one version's settings.

- tool_calling: LangChain's `create_agent` (a ReAct loop on LangGraph) with the run's tools and middleware for the
  prompt (variables filled in at every model call), short-term memory (a window of turns, or a summary) and the
  tool-call limit. A turn that called tools ends with a respond step: the answer is written by a call that is
  offered no tools, with the turn's tool results in its prompt. On a model the gateway holds to a tool-call schema
  (DESIGN §4), every reply of the loop is JSON, and a small one answers with the JSON of a call; the respond step
  never sees a schema, so its words are the answer, streamed token by token to the run's viewers.
- plan_execute: a planner writes the steps (JSON held to a schema), the run pauses with `interrupt()` so the user
  can edit, reorder, delete or add steps, an executor (a tool-calling agent) runs each step, an optional re-planner
  revises the remaining steps, and a last call, offered no tools and streamed, writes the answer from the steps'
  results.
- team: a tool-calling supervisor whose tools are other agents of the workspace (each with its own tools, prompt and
  memory scope), plus its own tools.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, TypedDict

from langchain.agents import create_agent
from langchain.agents.middleware import (
    ModelResponse,
    SummarizationMiddleware,
    ToolCallLimitMiddleware,
    after_agent,
    dynamic_prompt,
    wrap_model_call,
)
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from accounts.errors import ValidationFailed
from agent_studio import memory, toolkit
from agent_studio.config import check_plan
from agent_studio.models import Agent, AgentTemplate, StepKind
from agent_studio.strategies import ANSWER_TAG, gateway_model, model_for
from agent_studio.toolkit import RunContext
from workbridge.importers import function_name

CITE_HINT = "When you use passages from a knowledge base, cite them as [n]."
PLANNER = ("Break the user's request into a short list of concrete steps that you will carry out with your tools. "
           "Reply with JSON: {\"steps\": [\"...\", ...]}.")
REPLANNER = ("Given the request, the plan and the results so far, decide: continue with the remaining steps, revise "
             "them, or finish. Reply with JSON: {\"action\": \"continue\" | \"revise\" | \"finish\", \"steps\": "
             "[remaining steps when revising]}.")
ANSWERER = "Answer the user's request from the results of the steps below. Be brief."
RESPONDER = ("Answer the user's last message in plain sentences, from the facts the tools gave. Be brief. Do not "
             "write JSON and do not call a tool.")


class PlanUnreadable(Exception):
    """The planner's reply was not a usable plan, even when asked again."""


@dataclass
class Built:
    graph: object
    answer: Callable[[dict], str]


def last_answer(state: dict) -> str:
    """The final AI message's text; empty when the run ended on a tool call or a tool result."""
    for message in reversed(state.get("messages") or []):
        if isinstance(message, AIMessage):
            return "" if message.tool_calls else str(message.content).strip()
    return ""


def recent_turns(messages: list[BaseMessage], size: int) -> list[BaseMessage]:
    """The last `size` messages, starting at a user message so no tool result is left without its call."""
    kept = messages[-size:]
    for start, message in enumerate(kept):
        if isinstance(message, HumanMessage):
            return kept[start:]
    return kept


def plain_turns(messages: list[BaseMessage], size: int) -> list[BaseMessage]:
    """The conversation's words alone (no tool calls or results), the last `size` of them: what a call that is
    offered no tools is given as the earlier turns."""
    said = [m for m in messages if isinstance(m, (HumanMessage, AIMessage)) and not getattr(m, "tool_calls", None)
            and str(m.content).strip()]
    return recent_turns(said, size)


def write_answer(model, prompt: list[BaseMessage], *, streams: bool) -> str:
    """A reply from `model` as it is, with no tools. Streamed when it is the run's answer: the recorder publishes
    the tokens of calls tagged ANSWER_TAG as they come."""
    if streams:
        model = model.with_config(tags=[ANSWER_TAG])
    return "".join(chunk.text for chunk in model.stream(prompt)).strip()


def _models(context: RunContext):
    settings = context.settings
    inner = gateway_model(workspace_id=context.workspace_id, model=settings["model"],
                          temperature=settings["generation"]["temperature"],
                          max_tokens=settings["limits"]["max_tokens"],
                          timeout_s=min(settings["limits"]["timeout_s"], 300))
    return model_for(settings["tool_strategy"], inner), inner


def system_prompt(context: RunContext, extra: str = "") -> str:
    values = memory.variable_values(definitions=context.settings["variables"], thread=context.thread)
    parts = [memory.render_prompt(context.settings["system_prompt"], values), context.extra_prompt]
    if context.settings["knowledge_bases"]:
        parts.append(CITE_HINT)
    if extra:
        parts.append(extra)
    return "\n\n".join(part for part in parts if part)


def _call_keys(message: AIMessage) -> set[tuple[str, str]]:
    return {(call["name"], json.dumps(call["args"], sort_keys=True)) for call in message.tool_calls}


@wrap_model_call
def no_repeated_calls(request, handler):
    """A small model often calls the same tool with the same arguments again instead of answering. A call it has
    already had the result of is not made twice: the loop ends there, with no answer of its own, and the respond
    step answers from the results."""
    response = handler(request)
    reply = response.result[-1] if response.result else None
    if isinstance(reply, AIMessage) and reply.tool_calls:
        made = set().union(*(_call_keys(m) for m in request.messages if isinstance(m, AIMessage)))
        if _call_keys(reply) <= made:
            return ModelResponse(result=[AIMessage(content="", id=reply.id)])
    return response


def _call_text(call: dict) -> str:
    arguments = ", ".join(f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in call["args"].items())
    return f"{call['name']}({arguments})"


def _result_text(content) -> str:
    """A tool's result as a small model reads best: a JSON object as `key: value` lines under the call, anything
    else as it is after it."""
    try:
        value = json.loads(content) if isinstance(content, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict) or not value:
        return f" {content}"
    return "".join(f"\n  {key}: {item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)}"
                   for key, item in value.items())


def _respond(context: RunContext, model, *, streams: bool):
    """The respond step, the last of a turn that called tools (or whose loop ended without words): the answer is
    written with no tools offered, from the conversation and the turn's tool results, which are given as text
    (`name(arguments) returned:` and the result's fields as lines), never as the JSON of a call, which a small model
    would copy. The facts come before the question: asked first and given the facts after, SmolLM2-135M answered
    "What time is it in Shanghai?" with the time in 5 of 8 tries; given the facts first, in 8 of 8."""

    @after_agent
    def respond(state, runtime) -> dict | None:
        messages = state["messages"]
        start = max((n for n, m in enumerate(messages) if isinstance(m, HumanMessage)), default=0)
        turn = messages[start + 1:]
        calls = {call["id"]: call for m in turn if isinstance(m, AIMessage) for call in m.tool_calls}
        results = [f"- {_call_text(calls[m.tool_call_id]) if m.tool_call_id in calls else m.name} returned:"
                   f"{_result_text(m.content)}" for m in turn if isinstance(m, ToolMessage)]
        last = turn[-1] if turn else None
        loop_answered = isinstance(last, AIMessage) and not last.tool_calls and str(last.content).strip()
        if not results and loop_answered:
            return None
        question = str(messages[start].content)
        prompt = [SystemMessage(content=system_prompt(context, RESPONDER)),
                  *plain_turns(messages[:start], context.settings["memory"]["window_messages"]),
                  HumanMessage(content="Facts from the tools:\n" + "\n".join(results)
                               + f"\n\nUsing these facts, answer: {question}" if results else question)]
        text = write_answer(model, prompt, streams=streams)
        # The loop's own last words (a copied call, or none) give way to the answer: same id, replaced.
        replaced = last.id if isinstance(last, AIMessage) and not last.tool_calls else None
        return {"messages": [AIMessage(content=text, id=replaced)]}

    return respond


def _middleware(context: RunContext, summarizer, extra_prompt: str) -> list:
    @dynamic_prompt
    def prompt(request) -> str:
        return system_prompt(context, extra_prompt)

    policy = context.settings["memory"]
    size = policy["window_messages"]
    if policy["short_term"] == "summary":
        short_term = SummarizationMiddleware(model=summarizer, trigger=("messages", size), keep=("messages", size // 2))
    else:
        @wrap_model_call
        def short_term(request, handler):
            return handler(request.override(messages=recent_turns(request.messages, size)))
    return [prompt, short_term, no_repeated_calls,
            ToolCallLimitMiddleware(run_limit=context.settings["limits"]["max_tool_calls"], exit_behavior="continue")]


def tool_calling(context: RunContext, *, checkpointer, extra_tools: list | None = None, extra_prompt: str = "",
                 middleware: tuple = (), respond: bool = True, streams: bool = True) -> Built:
    """The tool-calling loop, ending with the respond step unless `respond` is off (a plan's executor, whose
    results the plan's answer is written from); `streams` when its answer is the run's (not a team member's)."""
    model, inner = _models(context)
    tools = [*toolkit.work_bridge_tools(context), *toolkit.knowledge_tools(context), *toolkit.memory_tools(context),
             *context.extra_tools, *(extra_tools or [])]
    if context.settings["limits"]["max_tool_calls"] == 0:
        tools = []
    finish = [_respond(context, inner, streams=streams)] if respond else []
    graph = create_agent(model, tools, middleware=[*middleware, *_middleware(context, inner, extra_prompt), *finish],
                         checkpointer=checkpointer, store=None)
    return Built(graph=graph, answer=last_answer)


def _sub_agent_tool(context: RunContext, agent: Agent) -> StructuredTool:
    settings = agent.versions.first().settings

    def ask(task: str) -> str:
        sub_context = replace(context, agent_id=agent.pk, agent_name=agent.name, settings=settings)
        built = tool_calling(sub_context, checkpointer=False, streams=False)
        state = built.graph.invoke({"messages": [HumanMessage(content=task)]},
                                   config={"callbacks": [context.recorder]})
        return built.answer(state) or "Tool error: the sub-agent ended without an answer."

    return StructuredTool.from_function(
        func=ask, name=function_name(f"ask_{agent.name}"),
        description=f"Give a task to the agent '{agent.name}'" + (f": {agent.description}" if agent.description else
                                                                   "") + ". Returns its answer.",
        args_schema={"type": "object", "required": ["task"],
                     "properties": {"task": {"type": "string", "description": "What the agent should do"}}})


def team(context: RunContext, *, checkpointer) -> Built:
    members = list(Agent.objects.filter(workspace_id=context.workspace_id, pk__in=context.settings["sub_agents"]))
    if missing := sorted(set(context.settings["sub_agents"]) - {agent.pk for agent in members}):
        raise toolkit.BindingMissing(f"This version of the team uses agent(s) {', '.join(map(str, missing))}, which "
                                     f"no longer exist; edit the team and save it without them.")
    hint = "You lead a team: give each part of the task to the team member best suited to it, then answer."
    return tool_calling(context, checkpointer=checkpointer, extra_prompt=hint,
                        extra_tools=[_sub_agent_tool(context, agent) for agent in members])


def step_result(state: dict, answer: str) -> str:
    """What a plan step found: its tools' results, which the answer is written from, and the executor's words."""
    found = [f"{message.name}: {message.content}" for message in state.get("messages", [])
             if isinstance(message, ToolMessage) and not str(message.content).startswith("Tool error")]
    return "\n".join([*found, answer] if answer else found) or "(no result)"


STEP_MARKER = "Now do step"


@wrap_model_call
def tools_the_step_names(request, handler):
    """A plan step that names some of the agent's tools is offered only those: a small model otherwise reaches for
    whichever tool it used last."""
    task = next((str(m.content) for m in reversed(request.messages) if isinstance(m, HumanMessage)), "")
    # Only the step being done counts: the task also quotes the request and the steps done so far.
    step = task.rpartition(STEP_MARKER)[2].lower()
    named = [tool for tool in request.tools if getattr(tool, "name", None) and tool.name.lower() in step]
    return handler(request.override(tools=named) if named else request)


class PlanState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    plan: list[str]
    results: list[dict]
    answer: str


def _json_schema_call(model, name: str, schema: dict, messages: list[BaseMessage]) -> dict:
    """A reply held to `schema` by the engine, parsed; asked twice before giving up."""
    bound = model.bind(response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
    problem = ""
    for _attempt in range(2):
        reply = bound.invoke(messages)
        try:
            value = json.loads(reply.content)
            if isinstance(value, dict):
                return value
            problem = "not a JSON object"
        except (TypeError, ValueError) as exc:
            problem = str(exc)
    raise PlanUnreadable(f"The planner's reply could not be read twice ({problem}).")


def plan_execute(context: RunContext, *, checkpointer) -> Built:
    _, inner = _models(context)
    planning = context.settings["planning"]
    executor = tool_calling(context, checkpointer=False, middleware=(tools_the_step_names,), respond=False,
                            extra_prompt="You are carrying out one step of a plan. Do only that step and report "
                                         "its result briefly.")
    recorder = context.recorder

    def question(state: PlanState) -> str:
        return next((str(m.content) for m in reversed(state["messages"]) if isinstance(m, HumanMessage)), "")

    def history(state: PlanState) -> list[BaseMessage]:
        return plain_turns(state["messages"][:-1], context.settings["memory"]["window_messages"])

    def plan(state: PlanState) -> dict:
        schema = {"type": "object", "required": ["steps"], "properties": {"steps": {
            "type": "array", "minItems": 1, "maxItems": planning["max_plan_steps"],
            "items": {"type": "string", "minLength": 1, "maxLength": 300}}}}
        reply = _json_schema_call(inner, "plan", schema, [SystemMessage(content=system_prompt(context, PLANNER)),
                                                          *history(state), HumanMessage(content=question(state))])
        try:
            steps = check_plan(reply.get("steps"), limit=planning["max_plan_steps"])
        except ValidationFailed as exc:
            raise PlanUnreadable(f"The planner wrote no usable plan: {exc.message}") from exc
        recorder.record(StepKind.PLAN, "plan", {"steps": steps})
        return {"plan": steps, "results": [], "answer": ""}

    def approve(state: PlanState) -> dict:
        if planning["approval"] == "auto":
            return {}
        decision = interrupt({"plan": state["plan"]})
        steps = check_plan(decision.get("plan") if isinstance(decision, dict) else None)
        recorder.record(StepKind.PLAN, "plan approved", {"steps": steps, "edited": steps != state["plan"]})
        return {"plan": steps}

    def execute(state: PlanState) -> dict:
        done = len(state["results"])
        step = state["plan"][done]
        so_far = "\n".join(f"{n}. {item['step']} -> {item['result']}" for n, item in enumerate(state["results"], 1))
        task = (f"The user's request: {question(state)}\n" + (f"Steps done so far:\n{so_far}\n" if so_far else "")
                + f"{STEP_MARKER} {done + 1}: {step}")
        out = executor.graph.invoke({"messages": [HumanMessage(content=task)]}, config={"callbacks": [recorder]})
        return {"results": [*state["results"], {"step": step, "result": step_result(out, executor.answer(out))}]}

    def replan(state: PlanState) -> dict:
        done = state["results"]
        schema = {"type": "object", "required": ["action"], "properties": {
            "action": {"enum": ["continue", "revise", "finish"]},
            "steps": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 300}}}}
        summary = json.dumps({"request": question(state), "plan": state["plan"], "results": done}, ensure_ascii=False)
        reply = _json_schema_call(inner, "replan", schema, [SystemMessage(content=system_prompt(context, REPLANNER)),
                                                            HumanMessage(content=summary)])
        kept = [item["step"] for item in done]
        if reply.get("action") == "finish":
            recorder.record(StepKind.PLAN, "plan finished early", {"steps": kept})
            return {"plan": kept}
        if reply.get("action") == "revise" and reply.get("steps"):
            steps = check_plan(kept + list(reply["steps"]), limit=len(kept) + planning["max_plan_steps"])
            recorder.record(StepKind.PLAN, "plan revised", {"steps": steps})
            return {"plan": steps}
        return {}

    def answer(state: PlanState) -> dict:
        results = "\n".join(f"{n}. {item['step']}\n{item['result']}" for n, item in enumerate(state["results"], 1))
        text = write_answer(inner, [SystemMessage(content=system_prompt(context, ANSWERER)),
                                    HumanMessage(content=f"Request: {question(state)}\n\nStep results:\n{results}")],
                            streams=True)
        return {"answer": text, "messages": [AIMessage(content=text)]}

    def after_step(state: PlanState) -> str:
        if len(state["results"]) >= len(state["plan"]):
            return "answer"
        return "replan" if planning["replan"] else "execute"

    def after_replan(state: PlanState) -> str:
        return "answer" if len(state["results"]) >= len(state["plan"]) else "execute"

    builder = StateGraph(PlanState)
    for name, node in (("plan", plan), ("approve", approve), ("execute", execute), ("replan", replan),
                       ("answer", answer)):
        builder.add_node(name, node)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", "execute")
    builder.add_conditional_edges("execute", after_step, ["execute", "replan", "answer"])
    builder.add_conditional_edges("replan", after_replan, ["execute", "answer"])
    builder.add_edge("answer", END)
    return Built(graph=builder.compile(checkpointer=checkpointer), answer=lambda state: state.get("answer", ""))


TEMPLATES = {AgentTemplate.TOOL_CALLING: tool_calling, AgentTemplate.PLAN_EXECUTE: plan_execute,
             AgentTemplate.TEAM: team}


def build(context: RunContext, *, checkpointer) -> Built:
    return TEMPLATES[context.settings["template"]](context, checkpointer=checkpointer)
