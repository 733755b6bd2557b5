"""Tool calls on models whose chat template has no tool-call format (DESIGN.md §4, "Tool calls on every model").

llama-server drops `tools` for such templates (SmolLM2, Gemma), and the model answers in prose. For a deployment
whose tool strategy is `constrained`, the gateway lists the tools in a system message and constrains the reply with
a JSON schema instead: one branch per tool (its name as a constant, its parameters as the arguments' schema) and,
unless a call is required, an "answer" branch for a reply without a call. The JSON is mapped back into OpenAI's
`tool_calls`, as a whole answer or as the chunks of a stream. llama.cpp turns the schema into a grammar, so the
arguments always match the tool's schema.
"""

import json
import re
import uuid

ANSWER = "answer"
AUTO, NONE, REQUIRED = "auto", "none", "required"
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


def reply_schema(functions: list[dict], choice: str) -> dict:
    branches = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                                  "arguments": function["parameters"]},
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


def _mapped_choice(choice: dict) -> dict:
    content = (choice.get("message") or {}).get("content") or ""
    try:
        reply = json.loads(content)
    except json.JSONDecodeError:
        reply = None  # cut short by max_tokens: passed on as the text it is, with the engine's finish reason
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
