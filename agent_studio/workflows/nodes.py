"""What each kind of node does, given the values of the nodes before it: every outside effect goes through the
platform's own path (models through the gateway, knowledge through rag_studio's retrieval, tools through Work
Bridge's invoke, code in Work Bridge's sandbox, URLs through the egress guard). A node that cannot do its work
raises NodeError with the reason; the runner applies the node's error policy. Each kind's record (kinds.py) names
its function here."""

import json
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from django.conf import settings as conf
from jinja2 import StrictUndefined, Template, TemplateError
from jinja2.sandbox import SandboxedEnvironment
from jsonschema import Draft202012Validator
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage

from accounts.errors import ApplicationError
from accounts.services import Actor
from agent_studio import log_messages, runner as agent_runner
from agent_studio.models import Agent, AgentRun, AgentThread, ThreadSource
from agent_studio.runs import leases
from agent_studio.runs.fields import RunStatus
from agent_studio.strategies import GatewayError, gateway_model
from agent_studio.workflows.checks import ELSE, ITEM, REFERENCE, parsed
from rag_studio.models import KnowledgeBase
from rag_studio.search.retrieval import retrieve
from workbridge import egress, sandbox
from workbridge.models import Tool
from workbridge.selectors import allowlist_for
from workbridge.services import invoke_tool

HTTP_MAX_BYTES = 1024 * 1024
MODEL_TIMEOUT_S = 120
PASSAGE_CHARS = 700
strict_jinja = SandboxedEnvironment(autoescape=False, undefined=StrictUndefined)


class NodeError(Exception):
    pass


@dataclass
class Context:
    """Who the run acts as, where, and the values of the nodes that have run (node id -> outputs)."""

    actor: Actor
    workspace_id: int
    caller: str
    values: dict
    check: object  # a callable raising when the run was cancelled
    input_tokens: int = 0
    output_tokens: int = 0
    shown: dict = field(default_factory=dict)
    # Given each piece of a model's text as it streams, for the nodes whose text is the run's answer.
    on_token: object = None


# What a kind of node does: its outputs, from the run's context and its checked settings.
Runner = Callable[[Context, dict], dict]


def lookup(values: dict, node: str, name: str, path: list[str]):
    where = ".".join([node, name, *path])
    if node not in values:
        raise NodeError(log_messages.NOT_RUN(where=where, node=node))
    value = values[node]
    if name not in value:
        raise NodeError(log_messages.NO_OUTPUT(where=where, node=node, name=name))
    value = value[name]
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise NodeError(log_messages.NO_PART(where=where, part=part, value=json.dumps(value)[:200]))
    return value


def variable(values: dict, text: str):
    return lookup(values, *parsed(text))


def as_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(text: str, values: dict) -> str:
    return REFERENCE.sub(lambda m: as_text(lookup(values, m[1], m[2], [p for p in m[3].split(".") if p])), text)


def resolve(value, values: dict):
    """A text that is one reference is the referenced value as it is (a list stays a list); other texts are
    rendered; anything else is itself."""
    if isinstance(value, str):
        whole = REFERENCE.fullmatch(value.strip())
        return variable(values, f"{whole[1]}.{whole[2]}{whole[3]}") if whole else render(value, values)
    return value


def _chat(context: Context, settings: dict, messages: list, schema: dict | None):
    model = gateway_model(workspace_id=context.workspace_id, model=settings["model"],
                          temperature=settings.get("temperature", 0.0), max_tokens=settings.get("max_tokens", 256),
                          timeout_s=MODEL_TIMEOUT_S)
    if schema is not None:
        model = model.bind(response_format={"type": "json_schema", "json_schema": {"name": "output",
                                                                                   "schema": schema}})
    try:
        reply = _streamed(model, messages, context.on_token) if schema is None and context.on_token else \
            model.invoke(messages)
    except GatewayError as exc:
        raise NodeError(log_messages.MODEL_CALL_FAILED(error=exc)) from exc
    usage = reply.usage_metadata or {}
    context.input_tokens += usage.get("input_tokens") or 0
    context.output_tokens += usage.get("output_tokens") or 0
    text = reply.content if isinstance(reply.content, str) else str(reply.content)
    if schema is None:
        return text.strip()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise NodeError(log_messages.REPLY_NOT_JSON(error=exc, reply=text[:200])) from exc
    problem = next(Draft202012Validator(schema).iter_errors(value), None)
    if problem is not None:
        raise NodeError(log_messages.JSON_OFF_SCHEMA(problem=problem.message))
    return value


def _streamed(model, messages: list, on_token) -> AIMessageChunk:
    """The reply as it streams, each piece of text handed on as it comes; the chunks add up to the whole reply,
    usage included."""
    reply = None
    for chunk in model.stream(messages):
        if isinstance(chunk.content, str) and chunk.content:
            on_token(chunk.content)
        reply = chunk if reply is None else reply + chunk
    return reply if reply is not None else AIMessageChunk(content="")


def llm(context: Context, settings: dict) -> dict:
    prompt = render(settings["prompt"], context.values)
    system = render(settings.get("system") or "", context.values)
    context.shown = {"system": system, "prompt": prompt}
    messages = ([SystemMessage(content=system)] if system else []) + [HumanMessage(content=prompt)]
    return {"output": _chat(context, settings, messages, settings.get("json_schema"))}


def classifier(context: Context, settings: dict) -> dict:
    query = render(settings["query"], context.values)
    classes = settings["classes"]
    context.shown = {"query": query}
    system = "\n".join(part for part in [render(settings.get("instructions") or "", context.values),
                                         f"Classify the text into exactly one of: {', '.join(classes)}. Reply with "
                                         f"JSON: {{\"class\": \"<one of them>\"}}."] if part)
    schema = {"type": "object", "required": ["class"], "properties": {"class": {"enum": classes}}}
    reply = _chat(context, settings | {"temperature": 0.0, "max_tokens": 64},
                  [SystemMessage(content=system), HumanMessage(content=query)], schema)
    return {"output": reply["class"]}


def knowledge(context: Context, settings: dict) -> dict:
    kb = KnowledgeBase.objects.filter(workspace_id=context.workspace_id, pk=settings["knowledge_base"]).first()
    if kb is None:
        raise NodeError(log_messages.KNOWLEDGE_BASE_GONE(id=settings["knowledge_base"]))
    query = render(settings["query"], context.values)
    context.shown = {"query": query}
    try:
        result = retrieve(kb, query)
    except ApplicationError as exc:
        raise NodeError(exc.message) from exc
    hits = [{"n": n, "document": hit.filename, "page": hit.page, "text": hit.text[:PASSAGE_CHARS]}
            for n, hit in enumerate(result.hits, 1)]
    text = "\n".join(f"[{hit['n']}] ({hit['document']}) {hit['text']}" for hit in hits)
    return {"output": text or "No passage matches.", "hits": hits}


def tool(context: Context, settings: dict) -> dict:
    found = Tool.objects.filter(workspace_id=context.workspace_id, pk=settings["tool"]).select_related(
        "workspace", "spec", "mcp_server").first()
    if found is None:
        raise NodeError(log_messages.TOOL_GONE(id=settings["tool"]))
    arguments = {name: resolve(value, context.values) for name, value in settings["arguments"].items()}
    context.shown = {"tool": found.name, "arguments": arguments}
    try:
        result = invoke_tool(actor=context.actor, tool=found, arguments=arguments, caller=context.caller)
    except ApplicationError as exc:
        raise NodeError(exc.message) from exc
    if not result.ok:
        raise NodeError(log_messages.TOOL_FAILED(tool=found.name, error=result.invocation.error))
    return {"output": result.output}


def code(context: Context, settings: dict) -> dict:
    arguments = {name: resolve(value, context.values) for name, value in settings["arguments"].items()}
    context.shown = {"arguments": arguments}
    try:
        result = sandbox.run_python(settings["code"], arguments, timeout_s=settings["timeout_s"],
                                    max_output_bytes=settings["max_output_bytes"])
    except sandbox.SandboxUnavailable as exc:
        raise NodeError(str(exc)) from exc
    context.shown |= {"stdout": result.stdout[-2000:], "stderr": result.stderr[-2000:]}
    if result.error:
        raise NodeError(result.error)
    return {"output": result.output}


def _number(value, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise NodeError(log_messages.NOT_A_NUMBER(where=where, value=json.dumps(value)[:100])) from None


def _holds(rule: dict, values: dict) -> bool:
    left = variable(values, rule["variable"])
    right = rule.get("value")
    op = rule["op"]
    if op in ("empty", "not_empty"):
        return (left in (None, "", [], {})) == (op == "empty")
    if op in ("gt", "ge", "lt", "le"):
        return getattr(operator, op)(_number(left, rule["variable"]), _number(right, "value"))
    if op in ("eq", "ne"):
        return (left == right or as_text(left) == as_text(right)) == (op == "eq")
    if op == "in":
        return isinstance(right, list) and left in right
    haystack, needle = as_text(left), as_text(right)
    return {"contains": needle in haystack, "not_contains": needle not in haystack,
            "starts_with": haystack.startswith(needle), "ends_with": haystack.endswith(needle)}[op]


def condition(context: Context, settings: dict) -> dict:
    for case in settings["cases"]:
        results = [_holds(rule, context.values) for rule in case["rules"]]
        if all(results) if case["match"] == "all" else any(results):
            return {"output": case["branch"]}
    return {"output": ELSE}


@lru_cache(maxsize=512)
def _compiled(text: str) -> Template:
    # Compiling is most of a template's cost; a workflow renders the same few templates run after run.
    return strict_jinja.from_string(text)


def template(context: Context, settings: dict) -> dict:
    try:
        return {"output": _compiled(settings["template"]).render(context.values)}
    except TemplateError as exc:
        raise NodeError(log_messages.TEMPLATE_FAILED(error=exc)) from exc


def http(context: Context, settings: dict) -> dict:
    url = render(settings["url"], context.values)
    headers = {name: render(value, context.values) for name, value in settings["headers"].items()}
    body = render(settings["body"], context.values) if settings["body"] else None
    context.shown = {"method": settings["method"], "url": url, "headers": sorted(headers)}
    try:
        answer = egress.request(settings["method"], url, headers=headers, content=body.encode() if body else None,
                                timeout_s=settings["timeout_s"], max_bytes=HTTP_MAX_BYTES,
                                allowlist=allowlist_for(workspace_id=context.workspace_id))
    except egress.EgressRefused as exc:
        raise NodeError(str(exc)) from exc
    if answer.status_code >= 400:
        raise NodeError(log_messages.HTTP_REFUSED(method=settings["method"], url=url, status=answer.status_code))
    output = answer.text
    if "json" in answer.headers.get("content-type", ""):
        try:
            output = answer.json()
        except ValueError:
            pass
    return {"output": output, "status": answer.status_code}


def iteration(context: Context, settings: dict, run_item: Runner) -> dict:
    """`run_item` is the body's kind's function, run on each item."""
    items = variable(context.values, settings["items"])
    if not isinstance(items, list):
        raise NodeError(log_messages.NOT_A_LIST(items=settings["items"], type=type(items).__name__))
    limit = conf.WORKFLOW_MAX_ITERATIONS
    if len(items) > limit:
        raise NodeError(log_messages.TOO_MANY_ITEMS(items=settings["items"], count=len(items), limit=limit))
    body = settings["do"]
    results = []
    for index, item in enumerate(items):
        context.check()
        inner = Context(actor=context.actor, workspace_id=context.workspace_id, caller=context.caller,
                        values={**context.values, ITEM: {"value": item, "index": index}}, check=context.check)
        results.append(run_item(inner, body["settings"])["output"])
        context.input_tokens += inner.input_tokens
        context.output_tokens += inner.output_tokens
    context.shown = {"items": len(items)}
    return {"output": results}


def aggregator(context: Context, settings: dict) -> dict:
    for name in settings["variables"]:
        try:
            value = variable(context.values, name)
        except NodeError:
            continue
        if value is not None:
            return {"output": value}
    raise NodeError(log_messages.NO_VARIABLE_VALUE(variables=", ".join(settings["variables"])))


def agent(context: Context, settings: dict) -> dict:
    """The agent's latest version run on the input, in a conversation of its own, as a step of this worker; the
    agent run keeps its own steps."""
    found = Agent.objects.filter(workspace_id=context.workspace_id, pk=settings["agent"]).first()
    if found is None:
        raise NodeError(log_messages.AGENT_GONE(id=settings["agent"]))
    text = render(settings["input"], context.values).strip()
    context.shown = {"agent": found.name, "input": text}
    if not text:
        raise NodeError(log_messages.AGENT_INPUT_EMPTY())
    thread = AgentThread.objects.create(agent=found, end_user=context.caller, source=ThreadSource.DEBUG)
    run = AgentRun.objects.create(workspace_id=context.workspace_id, agent=found, version=found.versions.first(),
                                  thread=thread, caller=context.caller, input=text, created_by=context.actor.user)
    agent_runner.execute(run.pk, owner=leases.owner_id(f"workflow-node-{run.public_id}"))
    run.refresh_from_db()
    context.input_tokens += run.input_tokens
    context.output_tokens += run.output_tokens
    if run.status != RunStatus.DONE:
        raise NodeError(log_messages.AGENT_RUN_ENDED(run=run.public_id, status=run.status,
                                                     error=run.error or "no answer"))
    return {"output": run.answer, "run_id": str(run.public_id)}


def answer(context: Context, settings: dict) -> dict:
    return {"output": render(settings["answer"], context.values)}
