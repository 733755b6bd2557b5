"""The public API of published apps, at /api/apps/<slug>/: chat (JSON or server-sent events), an
OpenAI-compatible chat/completions, retrieval for debugging, and feedback.

Written against plain requests and replies rather than Django's, like the gateway: factory/asgi.py serves
/api/apps/ from the bare ASGI app in app_api_asgi.py, past Django's handler and middleware (a thread hop per
middleware; together they cost about as much CPU as a whole retrieval), and `django_view` serves the same
endpoints through Django for runserver, WSGI and its test client. The OpenAI-compatible routes answer in
OpenAI's own error format.
"""

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from accounts.errors import ApplicationError, NotFound, ValidationFailed, error_body
from runtime import agent_answering, answering, services, workflow_answering
from runtime.access import Access, authorize, count_conversation
from runtime.models import App, Channel
from serving.chat_messages import CHAT_ROLES, check_messages
from serving.gateway import JSON, GatewayError, Reply, django_response

# The roles an app's OpenAI-compatible endpoint takes: the gateway's, less `tool` (an app runs no caller's tools).
APP_CHAT_ROLES = CHAT_ROLES - {"tool"}
OPENAI_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                      429: "rate_limit_error"}
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
logger = logging.getLogger(__name__)


@dataclass
class AppRequest:
    """One call of an app's API, whichever front end received it."""

    method: str
    slug: str
    endpoint: str  # the path after /api/apps/<slug>/
    authorization: str
    origin: str | None
    client: str | None  # the caller's address, for the web chat's rate limit
    # Reads the body, refusing one past the size limit; called only once the caller is authorised.
    read_body: Callable[[], Awaitable[bytes]]


def _json(payload: dict, *, status: int = 200) -> Reply:
    return Reply(status, json.dumps(payload, ensure_ascii=False, cls=DjangoJSONEncoder).encode(),
                 {"Content-Type": f"{JSON}; charset=utf-8"})


def _authorized(request: AppRequest) -> Access:
    return authorize(slug=request.slug, authorization=request.authorization, origin=request.origin,
                     client=request.client)


async def _authorize(request: AppRequest) -> Access:
    # Not thread-sensitive: the app's own pipeline may call this process's gateway while a request waits here.
    return await sync_to_async(_authorized, thread_sensitive=False)(request)


def _body(content: bytes) -> dict:
    try:
        body = json.loads(content or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"The request body is not valid JSON: {exc}")
    except ValueError as exc:  # an integer past Python's 4,300 digits
        raise ValidationFailed(f"The request body is not acceptable JSON: {exc}")
    if not isinstance(body, dict):
        raise ValidationFailed("The request body must be a JSON object.")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ValidationFailed("'stream' must be true or false.", fields={"stream": ["Must be a boolean."]})
    return body


def _with_cors(request: AppRequest, reply: Reply, app: App | None) -> Reply:
    """Browsers on an allowed origin may call the app straight from their page with the web chat token."""
    if app is not None and request.origin and request.origin in app.allowed_origins:
        reply.headers.update({"Access-Control-Allow-Origin": request.origin,
                              "Access-Control-Allow-Headers": "Authorization, Content-Type",
                              "Access-Control-Allow-Methods": "POST, GET, OPTIONS", "Vary": "Origin"})
    return reply


def error_reply(exc: ApplicationError) -> Reply:
    reply = _json(error_body(exc.code, exc.message, exc.fields), status=exc.status)
    if getattr(exc, "retry_after", None):  # rate limited, or a part of the platform down for a while
        reply.headers["Retry-After"] = str(exc.retry_after)
    return reply


def _openai_error(exc: ApplicationError) -> Reply:
    kind = OPENAI_ERROR_TYPES.get(exc.status, "invalid_request_error")
    param = next(iter(exc.fields), None)
    return GatewayError(exc.status, exc.message, code=exc.code, param=param, kind=kind,
                        retry_after=getattr(exc, "retry_after", None)).reply()


async def _preflight(request: AppRequest) -> Reply:
    app = await App.objects.filter(slug=request.slug).only("allowed_origins").afirst()
    return _with_cors(request, Reply(204, b""), app)


def _sse(event: str, data) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _ids(call: answering.Call) -> dict:
    conversation = str(call.conversation.public_id) if call.conversation else None
    return {"message_id": str(call.message_id), "conversation_id": conversation}


def _answer_body(call: answering.Call, result) -> dict:
    return {**_ids(call), "answer": result.answer, "citations": answering.public_citations(result),
            "usage": answering.usage_of(result), "timings_ms": result.timings_ms}


async def _chat_events(call: answering.Call):
    yield _sse("start", _ids(call))
    try:
        async for kind, value in answering.run(call):
            if kind == "hits":
                yield _sse("citations", {"queries": value.queries, "hits": answering.public_hits(value)})
            elif kind == "token":
                yield _sse("token", {"text": value})
            else:
                yield _sse("done", _answer_body(call, value))
    except Exception:  # the stream has started: report in-band rather than cut the connection
        logger.exception("App %s failed on message %s", call.access.app.slug, call.message_id)
        yield _sse("error", {"message": _failure_message(call), "code": AnswerFailed.code,
                             "message_id": str(call.message_id)})


async def _collect(call: answering.Call):
    result = None
    async for kind, value in answering.run(call):
        if kind == "done":
            result = value
    return result


class AnswerFailed(ApplicationError):
    """The app's model or index failed it (a stopped deployment, an engine error): not the caller's fault."""

    status = 502
    code = "answer_failed"


def _failure_message(call: answering.Call) -> str:
    # What failed inside (an engine's address, a file path) is for the app's owners, in its logs, not its callers.
    return (f"The app could not answer this question; its owners can see why in the app's logs "
            f"(message {call.message_id}).")


def _answer_failed(call: answering.Call, exc: Exception) -> AnswerFailed:
    logger.warning("App %s failed on message %s: %s", call.access.app.slug, call.message_id, exc)
    return AnswerFailed(_failure_message(call))


async def _post(request: AppRequest) -> tuple[Access, dict]:
    """Every app call is a POST of a JSON object by an authorised caller, checked in that order: the body is read
    only once the caller is known."""
    if request.method != "POST":
        raise ValidationFailed("Use POST with a JSON body.")
    access = await _authorize(request)
    body = _body(await request.read_body())
    if "conversation_id" in body:
        await sync_to_async(count_conversation, thread_sensitive=False)(access, body["conversation_id"])
    return access, body


async def _prepare(access: Access, body: dict, *, key_channel: str, query, history=None) -> answering.Call:
    """The question's call: on `key_channel` for an app key, on the web chat's channel for its token."""
    return await sync_to_async(answering.prepare, thread_sensitive=False)(
        access=access, channel=key_channel if access.app_key else Channel.WIDGET, query=query,
        stream=body.get("stream", False), user=body.get("user"), conversation_id=body.get("conversation_id"),
        history=history)


async def chat(request: AppRequest) -> Reply:
    """`{"query", "conversation_id"?, "user"?, "stream"?}` → the answer with its citations and usage, or with
    `stream` the events start, citations, token…, done."""
    if request.method == "OPTIONS":
        return await _preflight(request)
    access = None
    try:
        access, body = await _post(request)
        if access.app.is_workflow:
            return _with_cors(request, await _workflow_chat(access, body), access.app)
        call = await _prepare(access, body, key_channel=Channel.CHAT, query=body.get("query"))
        if access.app.is_agent:
            reply = await _agent_chat(call)
        elif call.stream:
            reply = Reply(200, _chat_events(call), dict(SSE_HEADERS))
        else:
            try:
                result = await _collect(call)
            except Exception as exc:
                raise _answer_failed(call, exc)
            reply = _json(_answer_body(call, result))
    except ApplicationError as exc:
        reply = error_reply(exc)
    return _with_cors(request, reply, access.app if access else None)


def _retrieved(access: Access, body: dict) -> dict:
    """Check, retrieve and store the trace in one thread hop: this is the endpoint load tests and debugging
    sessions call most."""
    if access.app.is_agent or access.app.is_workflow:
        what = "an agent" if access.app.is_agent else "a workflow"
        raise ValidationFailed(f"'{access.app.slug}' serves {what}, which searches its knowledge bases itself; "
                               f"use chat, whose events show each search.")
    call = answering.prepare(access=access, channel=Channel.RETRIEVE, query=body.get("query"),
                             user=body.get("user"))
    try:
        result = answering.retrieve(call)
    except Exception as exc:
        raise _answer_failed(call, exc)
    return {"message_id": str(call.message_id), "queries": result.queries, "hits": answering.public_hits(result),
            "timings_ms": result.timings_ms}


async def retrieve(request: AppRequest) -> Reply:
    """`{"query"}` → what the pinned config retrieves for it, with every score and the time each step took."""
    try:
        access, body = await _post(request)
        return _json(await sync_to_async(_retrieved, thread_sensitive=False)(access, body))
    except ApplicationError as exc:
        return error_reply(exc)


async def feedback(request: AppRequest) -> Reply:
    """`{"message_id", "rating": "up"|"down", "comment"?}` on one answer of this app."""
    if request.method == "OPTIONS":
        return await _preflight(request)
    access = None
    try:
        access, body = await _post(request)
        stored = await sync_to_async(services.record_feedback, thread_sensitive=False)(
            app=access.app, message_id=body.get("message_id"), rating=body.get("rating"),
            comment=body.get("comment", ""))
        reply = _json({"message_id": str(body["message_id"]), "rating": "up" if stored.rating > 0 else "down",
                       "comment": stored.comment})
    except ApplicationError as exc:
        reply = error_reply(exc)
    return _with_cors(request, reply, access.app if access else None)


def _openai_turn(body: dict) -> tuple[str, list[dict]]:
    """The last user message is the question; the messages before it are the conversation so far."""
    turns = check_messages(body.get("messages"), roles=APP_CHAT_ROLES, text_only=True)
    if turns[-1]["role"] != "user":
        raise ValidationFailed("The last message must come from the user: it is the question the app answers.",
                               fields={"messages": ["The last role must be 'user'."]})
    history = [turn for turn in turns[:-1] if turn["role"] in ("user", "assistant")]
    return turns[-1]["content"], history


def _completion_id(call: answering.Call) -> str:
    return f"chatcmpl-{call.message_id.hex}"


def _data(payload: dict | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def _chunk(call: answering.Call, created: int, delta: dict, finish_reason=None, **extra) -> bytes:
    body = {"id": _completion_id(call), "object": "chat.completion.chunk", "created": created,
            "model": call.access.app.slug, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            **extra}
    return _data(body)


async def _openai_events(call: answering.Call, include_usage: bool):
    created = int(time.time())
    yield _chunk(call, created, {"role": "assistant", "content": ""})
    try:
        async for kind, value in answering.run(call):
            if kind == "token":
                yield _chunk(call, created, {"content": value})
            elif kind == "done":
                yield _chunk(call, created, {}, "stop", citations=answering.public_citations(value), **_ids(call))
                if include_usage:
                    usage = {"id": _completion_id(call), "object": "chat.completion.chunk", "created": created,
                             "model": call.access.app.slug, "choices": [], "usage": answering.usage_of(value)}
                    yield _data(usage)
    except Exception:  # OpenAI's clients raise an APIError on an in-stream error object
        logger.exception("App %s failed on message %s", call.access.app.slug, call.message_id)
        error = {"message": _failure_message(call), "type": "server_error", "code": "answer_failed"}
        yield _data({"error": error})
    yield _data("[DONE]")


async def openai_chat_completions(request: AppRequest) -> Reply:
    """OpenAI's chat/completions: point the official client at /api/apps/<slug>/v1. The answer carries the
    extra fields `citations`, `message_id` and `conversation_id`."""
    try:
        access, body = await _post(request)
        query, history = _openai_turn(body)
        if access.app.is_workflow:
            return await _workflow_openai(access, body, query, history)
        call = await _prepare(access, body, key_channel=Channel.OPENAI, query=query, history=history)
        if access.app.is_agent:
            return await _agent_openai(call, body)
        if call.stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Reply(200, _openai_events(call, include_usage), dict(SSE_HEADERS))
        try:
            result = await _collect(call)
        except Exception as exc:
            raise _answer_failed(call, exc)
    except ApplicationError as exc:
        return _openai_error(exc)
    return _json({
        "id": _completion_id(call), "object": "chat.completion", "created": int(time.time()),
        "model": call.access.app.slug,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.answer}, "finish_reason": "stop"}],
        "usage": answering.usage_of(result), "citations": answering.public_citations(result), **_ids(call)})


async def openai_models(request: AppRequest) -> Reply:
    try:
        access = await _authorize(request)
    except ApplicationError as exc:
        return _openai_error(exc)
    return _json({"object": "list", "data": [
        {"id": access.app.slug, "object": "model", "created": int(access.app.created_at.timestamp()),
         "owned_by": access.app.workspace.slug}]})


# ---- agent apps: the run's steps as it goes, a plan to approve, the answer ----

def _run_body(call: answering.Call, run, data: dict) -> dict:
    body = {**_ids(call), "run_id": str(run.public_id), "status": data.get("status"), "answer": data.get("answer", ""),
            "citations": data.get("citations", []), "usage": data.get("usage", {})}
    if data.get("status") == "awaiting_approval":
        body["plan"] = data.get("plan", [])
        body["approve_url"] = f"/api/apps/{call.access.app.slug}/runs/{run.public_id}/approve"
    return body


async def _agent_outcome(call: answering.Call, run, after: str = "0") -> dict:
    try:
        event, data = await agent_answering.outcome(run, after=after)
    except agent_answering.RunTimedOut as exc:
        raise _answer_failed(call, exc)
    finally:
        await agent_answering.store(call, run)
    if event in ("error", "cancelled"):
        raise _answer_failed(call, RuntimeError(data.get("error", event)))
    return _run_body(call, run, data)


async def _agent_events(call: answering.Call, run, after: str = "0"):
    """start, step… then plan (awaiting approval), or the answer's tokens as the agent writes it and done; error if
    it failed. An answer that was not streamed (written in a tool-calling reply, or a run already over and replayed
    from its rows) comes as one token."""
    yield _sse("start", {**_ids(call), "run_id": str(run.public_id)})
    streamed = False
    try:
        async for event, data in agent_answering.follow(run, after=after):
            if event == "step":
                yield _sse("step", data)
            elif event == "token":
                streamed = True
                yield _sse("token", {"text": data.get("text", "")})
            elif event == "plan":
                yield _sse("plan", _run_body(call, run, data))
            elif event == "done":
                if not streamed:
                    yield _sse("token", {"text": data.get("answer", "")})
                yield _sse("done", _run_body(call, run, data))
            elif event in ("error", "cancelled"):
                logger.warning("Agent app %s run %s ended %s: %s", call.access.app.slug, run.public_id, event,
                               data.get("error"))
                yield _sse("error", {"message": _failure_message(call), "run_id": str(run.public_id)})
    except agent_answering.RunTimedOut:
        yield _sse("error", {"message": _failure_message(call), "run_id": str(run.public_id)})
    finally:
        await agent_answering.store(call, run)


async def _start_agent_run(call: answering.Call):
    return await sync_to_async(agent_answering.start, thread_sensitive=False)(call)


async def _agent_chat(call: answering.Call) -> Reply:
    run = await _start_agent_run(call)
    if call.stream:
        return Reply(200, _agent_events(call, run), dict(SSE_HEADERS))
    return _json(await _agent_outcome(call, run))


async def _agent_openai(call: answering.Call, body: dict) -> Reply:
    """An agent app on OpenAI's chat/completions: the answer as the message (a plan awaiting approval as its
    text, with `run_id` and `approve_url` beside it), steps in `agent_steps` when not streaming."""
    run = await _start_agent_run(call)
    outcome = await _agent_outcome(call, run)
    content = outcome["answer"] if outcome["status"] != "awaiting_approval" else (
        "Plan awaiting approval:\n" + "\n".join(f"{n}. {step}" for n, step in enumerate(outcome["plan"], 1)))
    extra = {key: outcome[key] for key in ("run_id", "status", "citations", "plan", "approve_url") if key in outcome}
    usage = {"prompt_tokens": outcome["usage"].get("input_tokens"), "completion_tokens":
             outcome["usage"].get("output_tokens")}
    usage["total_tokens"] = (usage["prompt_tokens"] or 0) + (usage["completion_tokens"] or 0)
    created = int(time.time())
    if call.stream:
        async def chunks():
            yield _chunk(call, created, {"role": "assistant", "content": ""})
            yield _chunk(call, created, {"content": content})
            yield _chunk(call, created, {}, "stop", **extra, **_ids(call))
            if (body.get("stream_options") or {}).get("include_usage"):
                yield _data({"id": _completion_id(call), "object": "chat.completion.chunk", "created": created,
                             "model": call.access.app.slug, "choices": [], "usage": usage})
            yield _data("[DONE]")

        return Reply(200, chunks(), dict(SSE_HEADERS))
    return _json({"id": _completion_id(call), "object": "chat.completion", "created": created,
                  "model": call.access.app.slug, "usage": usage, **extra, **_ids(call),
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                               "finish_reason": "stop"}]})


async def approve_run(request: AppRequest, run_id: str) -> Reply:
    """`{"plan": ["step", ...], "stream"?}` resumes an agent app's run paused on its plan, with the plan as edited;
    the answer (or with `stream`, the events step…, token, done) as `chat` gives it."""
    if request.method == "OPTIONS":
        return await _preflight(request)
    access = None
    try:
        access, body = await _post(request)
        if not access.app.is_agent:
            raise NotFound(f"'{access.app.slug}' serves no agent: it has no runs to approve.")
        run, after = await sync_to_async(agent_answering.approve, thread_sensitive=False)(
            app=access.app, public_id=run_id, plan=body.get("plan"))
        call = await sync_to_async(agent_answering.resumed_call, thread_sensitive=False)(
            access=access, run=run, stream=body.get("stream", False))
        if call.stream:
            reply = Reply(200, _agent_events(call, run, after), dict(SSE_HEADERS))
        else:
            reply = _json(await _agent_outcome(call, run, after))
    except ApplicationError as exc:
        reply = error_reply(exc)
    return _with_cors(request, reply, access.app if access else None)


# ---- workflow apps: each node's start and record, the answer's tokens, the answer ----

async def _workflow_prepare(access: Access, body: dict, *, key_channel: str, query=None, history=None):
    return await sync_to_async(workflow_answering.prepare, thread_sensitive=False)(
        access=access, channel=key_channel if access.app_key else Channel.WIDGET, body=body, query=query,
        history=history)


def _workflow_body(call: answering.Call, run, data: dict) -> dict:
    # No citations of their own (a knowledge node's hits are in its record), but the web chat reads the field.
    return {**_ids(call), "run_id": str(run.public_id), "status": data.get("status"),
            "answer": data.get("answer", ""), "citations": [], "outputs": data.get("outputs", {}),
            "usage": data.get("usage", {}), "latency_ms": data.get("latency_ms")}


async def _workflow_outcome(call: answering.Call, run) -> dict:
    try:
        event, data = await workflow_answering.outcome(run)
    except workflow_answering.RunTimedOut as exc:
        raise _answer_failed(call, exc)
    finally:
        await workflow_answering.store(call, run)
    if event in ("error", "cancelled"):
        raise _answer_failed(call, RuntimeError(data.get("error", event)))
    return _workflow_body(call, run, data)


async def _workflow_answer(call: answering.Call, run):
    """("node_started" | "node_finished", event), ("token", text)…, then ("done", body): an answer that was not
    streamed (written by a template, or a run replayed from its rows) comes as one token. AnswerFailed when the
    run failed."""
    streamed = False
    try:
        async for event, data in workflow_answering.follow(run):
            if event == "node":
                yield workflow_answering.node_event(data)
            elif event == "token":
                streamed = True
                yield "token", data.get("text", "")
            elif event == "done":
                if not streamed:
                    yield "token", data.get("answer", "")
                yield "done", _workflow_body(call, run, data)
            elif event in ("error", "cancelled"):
                raise _answer_failed(call, RuntimeError(data.get("error", event)))
    except workflow_answering.RunTimedOut as exc:
        raise _answer_failed(call, exc)
    finally:
        await workflow_answering.store(call, run)


async def _workflow_events(call: answering.Call, run):
    """start, node_started / node_finished per node, token…, done; error if the run failed."""
    yield _sse("start", {**_ids(call), "run_id": str(run.public_id)})
    try:
        async for event, value in _workflow_answer(call, run):
            yield _sse(event, {"text": value} if event == "token" else value)
    except AnswerFailed as exc:
        yield _sse("error", {"message": exc.message, "code": exc.code, "message_id": str(call.message_id),
                             "run_id": str(run.public_id)})


async def _start_workflow_run(call: answering.Call, inputs: dict):
    return await sync_to_async(workflow_answering.start, thread_sensitive=False)(call, inputs)


async def _workflow_chat(access: Access, body: dict) -> Reply:
    """`{"query"?, "inputs"?, "conversation_id"?, "user"?, "stream"?}`: the query fills the workflow's chat input,
    `inputs` any of its inputs."""
    call, inputs = await _workflow_prepare(access, body, key_channel=Channel.CHAT,
                                           query=body.get("query") if "query" in body else None)
    run = await _start_workflow_run(call, inputs)
    if call.stream:
        return Reply(200, _workflow_events(call, run), dict(SSE_HEADERS))
    return _json(await _workflow_outcome(call, run))


async def _workflow_openai(access: Access, body: dict, query: str, history: list[dict]) -> Reply:
    """A chat-shaped workflow on OpenAI's chat/completions: the last user message fills its chat input, and the
    answer node's tokens stream as the chunks' content."""
    call, inputs = await _workflow_prepare(access, body, key_channel=Channel.OPENAI, query=query, history=history)
    run = await _start_workflow_run(call, inputs)
    created = int(time.time())

    def usage_of(outcome: dict) -> dict:
        usage = outcome.get("usage") or {}
        prompt, completion = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    if call.stream:
        async def chunks():
            yield _chunk(call, created, {"role": "assistant", "content": ""})
            try:
                async for event, value in _workflow_answer(call, run):
                    if event == "token":
                        yield _chunk(call, created, {"content": value})
                    elif event == "done":
                        yield _chunk(call, created, {}, "stop", run_id=value["run_id"], **_ids(call))
                        if (body.get("stream_options") or {}).get("include_usage"):
                            yield _data({"id": _completion_id(call), "object": "chat.completion.chunk",
                                         "created": created, "model": call.access.app.slug, "choices": [],
                                         "usage": usage_of(value)})
            except AnswerFailed as exc:
                yield _data({"error": {"message": exc.message, "type": "server_error", "code": exc.code}})
            yield _data("[DONE]")

        return Reply(200, chunks(), dict(SSE_HEADERS))
    outcome = await _workflow_outcome(call, run)
    return _json({"id": _completion_id(call), "object": "chat.completion", "created": created,
                  "model": call.access.app.slug, "usage": usage_of(outcome), "run_id": outcome["run_id"],
                  **_ids(call), "choices": [{"index": 0, "message": {"role": "assistant",
                                                                     "content": outcome["answer"]},
                                             "finish_reason": "stop"}]})


ENDPOINTS = {"chat": chat, "retrieve": retrieve, "feedback": feedback,
             "v1/chat/completions": openai_chat_completions, "v1/models": openai_models}
APPROVE = re.compile(r"runs/(?P<run_id>[^/]+)/approve")


async def handle(request: AppRequest) -> Reply:
    endpoint = ENDPOINTS.get(request.endpoint)
    if endpoint is not None:
        return await endpoint(request)
    if approval := APPROVE.fullmatch(request.endpoint):
        return await approve_run(request, approval.group("run_id"))
    where = f"/api/apps/{request.slug}/{request.endpoint}"
    if request.endpoint.startswith("v1/"):
        return _openai_error(NotFound(f"Unknown endpoint {where}; apps serve chat/completions and models."))
    return error_reply(NotFound(f"Unknown endpoint {where}; apps serve chat, retrieve, feedback, "
                                f"runs/<run_id>/approve and v1/."))


@csrf_exempt
async def django_view(request: HttpRequest, slug: str, endpoint: str) -> HttpResponse:
    """The app API through Django: for runserver, WSGI and Django's test client. factory/asgi.py serves
    /api/apps/ past Django (app_api_asgi), which also refuses an oversized body as it arrives."""

    async def read_body() -> bytes:
        return request.body

    return django_response(await handle(AppRequest(
        method=request.method, slug=slug, endpoint=endpoint, authorization=request.headers.get("Authorization", ""),
        origin=request.headers.get("Origin"), client=request.META.get("REMOTE_ADDR"), read_body=read_body)))
