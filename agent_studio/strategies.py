"""How an agent's model calls tools. Every strategy is a LangChain chat model, so the LangGraph templates run
unchanged whichever is chosen:

- `native`: OpenAI `tools` through the gateway (which itself holds a model without a tool-call template to a JSON
  schema, DESIGN §4);
- `json`: the model is asked for `{"tool": ..., "arguments": ...}` or `{"final": ...}` with a JSON-schema
  `response_format`, and the reply is turned into tool calls; a reply that does not parse is retried once;
- `react_text`: the model writes Thought / Action / Action Input or Final Answer, parsed from the text.

The prompted strategies are thin chat models around the gateway's ChatOpenAI: they render the conversation
(earlier tool calls and results included) into plain roles every chat template knows, and parse the reply back
into an AIMessage with `tool_calls`. Only the inner ChatOpenAI calls reach the gateway; they carry the tag
GATEWAY_TAG, which is how a run counts its model calls.
"""

import json
import re
import time
import uuid
from collections.abc import Sequence
from functools import cache

import httpx
from django.conf import settings
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from openai import APIError as GatewayError

from accounts.cancellation import CancellableTransport
from accounts.services import service_token
from agent_studio.models import ToolStrategy

GATEWAY_TAG = "aifactory:gateway"
# A call whose words are the run's answer: the recorder streams its tokens to the run's viewers as they come.
ANSWER_TAG = "aifactory:answer"
__all__ = ["ANSWER_TAG", "GATEWAY_TAG", "GatewayError", "ToolReplyInvalid", "gateway_model", "model_for", "probe"]
REACT_STOP = ["\nObservation:"]


class ToolReplyInvalid(Exception):
    """The model's reply could not be read as a tool call or an answer, even when asked again."""


@cache
def _gateway_client() -> httpx.Client:
    # A cancelled run shuts its model call's connection: the call ends at once, and the gateway frees the slot.
    return httpx.Client(transport=CancellableTransport())


def gateway_model(*, workspace_id: int, model: str, temperature: float, max_tokens: int,
                  timeout_s: float) -> ChatOpenAI:
    """A chat model on the platform's own gateway, with the workspace's service token: routed, failed over and
    measured (TTFT/TPOT) like any request. A streamed call asks for its usage too, so its tokens are counted."""
    return ChatOpenAI(base_url=settings.GATEWAY_URL, api_key=service_token(workspace_id=workspace_id), model=model,
                      temperature=temperature, max_tokens=max_tokens, max_retries=0, timeout=timeout_s,
                      stream_usage=True, tags=[GATEWAY_TAG], http_client=_gateway_client())


class _PromptedToolCaller(BaseChatModel):
    """A chat model that asks for tool calls in its prompt and reads them from the reply."""

    inner: BaseChatModel
    tools: list[dict] = []
    # "none" asks for an answer, whatever tools there are (OpenAI's tool_choice).
    tool_choice: str | None = None

    def bind_tools(self, tools: Sequence, *, tool_choice=None, **kwargs) -> "_PromptedToolCaller":
        return self.model_copy(update={"tools": [convert_to_openai_tool(tool)["function"] for tool in tools],
                                       "tool_choice": tool_choice if isinstance(tool_choice, str) else None})

    @property
    def offered(self) -> list[dict]:
        return [] if self.tool_choice == "none" else self.tools

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs) -> ChatResult:
        prompt = self._render(messages)
        error = None
        for _attempt in range(2):
            reply = self._ask(prompt, run_manager)
            try:
                message = self._parse(reply.content if isinstance(reply.content, str) else str(reply.content))
            except ValueError as exc:
                error = exc
                prompt = prompt + [AIMessage(content=str(reply.content)),
                                   HumanMessage(content=f"Your reply could not be read: {exc} {self._format_hint()}")]
                continue
            message.usage_metadata = reply.usage_metadata
            return ChatResult(generations=[ChatGeneration(message=message)])
        raise ToolReplyInvalid(f"The model's reply was not a tool call or an answer, twice: {error}")

    def _ask(self, prompt: list[BaseMessage], run_manager) -> AIMessage:
        # The run's handlers see the gateway call itself (tagged GATEWAY_TAG), as with the native strategy.
        return self._bound().invoke(prompt, config={"callbacks": run_manager.handlers if run_manager else None})

    def _bound(self):
        return self.inner

    def _render(self, messages: list[BaseMessage]) -> list[BaseMessage]:
        """The conversation in system/user/assistant roles only, with the tool instructions added to the system
        message."""
        system = [m.content for m in messages if isinstance(m, SystemMessage)]
        rendered: list[BaseMessage] = [SystemMessage(content="\n\n".join([*system, self._instructions()]).strip())]
        names = {}
        for message in messages:
            if isinstance(message, SystemMessage):
                continue
            if isinstance(message, AIMessage) and message.tool_calls:
                for call in message.tool_calls:
                    names[call.get("id")] = call["name"]
                rendered.append(AIMessage(content=self._render_calls(message)))
            elif isinstance(message, ToolMessage):
                name = names.get(message.tool_call_id, message.name or "tool")
                rendered.append(HumanMessage(content=f"Observation from {name}: {message.content}"))
            elif isinstance(message, AIMessage):
                rendered.append(AIMessage(content=str(message.content)))
            else:
                rendered.append(HumanMessage(content=str(message.content)))
        return rendered

    def _tool_list(self) -> str:
        return "\n".join(f"- {tool['name']}: {tool.get('description', '')} Arguments (JSON Schema): "
                         f"{json.dumps(tool.get('parameters', {}), ensure_ascii=False)}" for tool in self.offered)

    def _tool_call(self, name: str, arguments) -> AIMessage:
        known = {tool["name"] for tool in self.offered}
        if name not in known:
            raise ValueError(f"there is no tool '{name}' (the tools are {', '.join(sorted(known)) or 'none'}).")
        if not isinstance(arguments, dict):
            raise ValueError("the arguments must be a JSON object.")
        return AIMessage(content="", tool_calls=[{"name": name, "args": arguments, "id": f"call_{uuid.uuid4().hex}",
                                                  "type": "tool_call"}])

    def _instructions(self) -> str:
        raise NotImplementedError

    def _format_hint(self) -> str:
        raise NotImplementedError

    def _render_calls(self, message: AIMessage) -> str:
        raise NotImplementedError

    def _parse(self, text: str) -> AIMessage:
        raise NotImplementedError


class JsonToolCaller(_PromptedToolCaller):
    """`{"tool": name, "arguments": {...}}` or `{"final": answer}`, held to that schema by the engine."""

    @property
    def _llm_type(self) -> str:
        return "aifactory-json-tools"

    def _schema(self) -> dict:
        branches = [{"type": "object", "properties": {"tool": {"const": tool["name"]},
                                                      "arguments": tool.get("parameters") or {"type": "object"}},
                     "required": ["tool", "arguments"]} for tool in self.offered]
        branches.append({"type": "object", "properties": {"final": {"type": "string"}}, "required": ["final"]})
        return {"anyOf": branches}

    def _bound(self):
        return self.inner.bind(response_format={"type": "json_schema", "json_schema": {
            "name": "agent_step", "schema": self._schema()}})

    def _instructions(self) -> str:
        if not self.offered:
            return 'Reply with a JSON object: {"final": "<your answer>"}.'
        return ("You can call these tools:\n" + self._tool_list() + "\n\nReply with one JSON object: "
                '{"tool": "<tool name>", "arguments": {...}} to call a tool, or {"final": "<your answer>"} when '
                "you can answer.")

    def _format_hint(self) -> str:
        return 'Reply with {"tool": ..., "arguments": {...}} or {"final": ...} only.'

    def _render_calls(self, message: AIMessage) -> str:
        call = message.tool_calls[0]
        return json.dumps({"tool": call["name"], "arguments": call["args"]}, ensure_ascii=False)

    def _parse(self, text: str) -> AIMessage:
        try:
            reply = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"it is not JSON ({exc.args[0]}).") from exc
        if isinstance(reply, dict) and isinstance(reply.get("final"), str):
            return AIMessage(content=reply["final"])
        if isinstance(reply, dict) and isinstance(reply.get("tool"), str):
            return self._tool_call(reply["tool"], reply.get("arguments", {}))
        raise ValueError("it has neither 'tool' nor 'final'.")


ACTION = re.compile(r"Action\s*:\s*(?P<name>[A-Za-z][\w-]*)\s*\n+\s*Action\s*Input\s*:\s*(?P<args>.*)", re.DOTALL)
FINAL = re.compile(r"Final\s*Answer\s*:\s*(?P<answer>.*)", re.DOTALL)


class ReactTextCaller(_PromptedToolCaller):
    """Thought / Action / Action Input, or Final Answer, in plain text."""

    @property
    def _llm_type(self) -> str:
        return "aifactory-react-text"

    def _bound(self):
        return self.inner.bind(stop=REACT_STOP)

    def _instructions(self) -> str:
        if not self.offered:
            return "Reply as:\nFinal Answer: <your answer>"
        return ("You can use these tools:\n" + self._tool_list() + "\n\nTo use a tool, reply exactly:\n"
                "Thought: <why>\nAction: <tool name>\nAction Input: <a JSON object of arguments>\n\n"
                "You will then get an Observation. When you know the answer, reply:\nFinal Answer: <your answer>")

    def _format_hint(self) -> str:
        return "Reply with 'Action:' and 'Action Input:' lines, or with 'Final Answer:'."

    def _render_calls(self, message: AIMessage) -> str:
        call = message.tool_calls[0]
        return f"Action: {call['name']}\nAction Input: {json.dumps(call['args'], ensure_ascii=False)}"

    def _parse(self, text: str) -> AIMessage:
        action, final = ACTION.search(text), FINAL.search(text)
        if action and (not final or action.start() < final.start()):
            raw = action.group("args").strip().split("\nObservation")[0].strip()
            try:
                arguments = json.loads(raw) if raw else {}
            except ValueError as exc:
                raise ValueError(f"the Action Input is not a JSON object ({exc.args[0]}).") from exc
            return self._tool_call(action.group("name"), arguments)
        if final:
            return AIMessage(content=final.group("answer").strip())
        raise ValueError("it has neither an Action nor a Final Answer.")


def model_for(strategy: str, inner: BaseChatModel) -> BaseChatModel:
    """The chat model an agent's template runs with, for its tool-calling strategy."""
    if strategy == ToolStrategy.JSON:
        return JsonToolCaller(inner=inner)
    if strategy == ToolStrategy.REACT_TEXT:
        return ReactTextCaller(inner=inner)
    return inner


PROBE_TOOL = {"type": "function", "function": {
    "name": "get_local_time", "description": "The current local time in a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
PROBE_QUESTION = "What time is it in Tokyo right now? Use the tool."


def probe(*, workspace_id: int, model: str, timeout_s: float = 60) -> dict:
    """Try each strategy once on the deployment with a question that needs a tool: the first that makes a
    well-formed call to it is suggested (native first: it costs the fewest tokens)."""
    results, suggested = {}, None
    for strategy in (ToolStrategy.NATIVE, ToolStrategy.JSON, ToolStrategy.REACT_TEXT):
        inner = gateway_model(workspace_id=workspace_id, model=model, temperature=0.0, max_tokens=128,
                              timeout_s=timeout_s)
        started = time.perf_counter()
        try:
            reply = model_for(strategy, inner).bind_tools([PROBE_TOOL]).invoke(PROBE_QUESTION)
            calls = [call for call in reply.tool_calls if call["name"] == "get_local_time"]
            ok = bool(calls) and isinstance(calls[0]["args"].get("city"), str)
            detail = f"called get_local_time({json.dumps(calls[0]['args'], ensure_ascii=False)})" if calls else \
                f"answered without calling the tool: {str(reply.content)[:200]!r}"
        except Exception as exc:  # each failure is a finding of the probe, reported, not raised
            ok, detail = False, f"{type(exc).__name__}: {exc}"[:300]
        results[strategy] = {"ok": ok, "detail": detail, "latency_ms": round((time.perf_counter() - started) * 1000)}
        if ok and suggested is None:
            suggested = strategy
    return {"suggested": suggested or ToolStrategy.JSON, "results": results}
