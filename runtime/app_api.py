"""The public API of published apps, at /api/apps/<slug>/: chat (JSON or server-sent events), an
OpenAI-compatible chat/completions, retrieval for debugging, and feedback.

Plain async views rather than DRF, as in the gateway: the answer streams from the event loop, and the
OpenAI-compatible routes must answer in OpenAI's own error format.
"""

import json
import time

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from accounts.errors import ApplicationError, NotFound, ValidationFailed, error_body
from runtime import answering, services
from runtime.access import Access, RateLimited, authorize
from runtime.models import App, Channel
from serving.gateway import GatewayError, django_response

CHAT_ROLES = {"system", "developer", "user", "assistant"}
OPENAI_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                      429: "rate_limit_error"}


def _own_origin(request: HttpRequest) -> str:
    return f"{request.scheme}://{request.get_host()}"


async def _authorize(request: HttpRequest, slug: str) -> Access:
    # Not thread-sensitive: the app's own pipeline may call this process's gateway while a request waits here.
    return await sync_to_async(authorize, thread_sensitive=False)(
        slug=slug, authorization=request.headers.get("Authorization", ""), origin=request.headers.get("Origin"),
        own_origin=_own_origin(request))


def _body(request: HttpRequest) -> dict:
    try:
        body = json.loads(request.body or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"The request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        raise ValidationFailed("The request body must be a JSON object.")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ValidationFailed("'stream' must be true or false.", fields={"stream": ["Must be a boolean."]})
    return body


def _with_cors(request: HttpRequest, response: HttpResponse, app: App | None) -> HttpResponse:
    """Browsers on an allowed origin may call the app straight from their page with the web chat token."""
    origin = request.headers.get("Origin")
    if app is not None and origin and origin in app.allowed_origins:
        response["Access-Control-Allow-Origin"] = origin
        response["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
        response["Access-Control-Allow-Methods"] = "POST, GET, OPTIONS"
        response["Vary"] = "Origin"
    return response


def _error(exc: ApplicationError) -> JsonResponse:
    response = JsonResponse(error_body(exc.code, exc.message, exc.fields), status=exc.status)
    if isinstance(exc, RateLimited):
        response["Retry-After"] = str(exc.retry_after)
    return response


def _openai_error(exc: ApplicationError) -> JsonResponse:
    kind = OPENAI_ERROR_TYPES.get(exc.status, "invalid_request_error")
    param = next(iter(exc.fields), None)
    response = django_response(GatewayError(exc.status, exc.message, code=exc.code, param=param, kind=kind).reply())
    if isinstance(exc, RateLimited):
        response["Retry-After"] = str(exc.retry_after)
    return response


async def _preflight(request: HttpRequest, slug: str) -> HttpResponse:
    app = await App.objects.filter(slug=slug).only("allowed_origins").afirst()
    return _with_cors(request, HttpResponse(status=204), app)


def _sse(event: str, data) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


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
    except Exception as exc:  # the stream has started: report in-band rather than cut the connection
        yield _sse("error", {"message": f"The answer failed: {exc}"})


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


def _answer_failed(exc: Exception) -> AnswerFailed:
    return AnswerFailed(f"The app could not answer: {exc}")


async def _posted(request: HttpRequest, slug: str) -> tuple[Access, dict]:
    """Every app call is a POST of a JSON object by an authorised caller, checked in that order."""
    if request.method != "POST":
        raise ValidationFailed("Use POST with a JSON body.")
    access = await _authorize(request, slug)
    return access, _body(request)


@csrf_exempt
async def chat(request: HttpRequest, slug: str) -> HttpResponse:
    """`{"query", "conversation_id"?, "user"?, "stream"?}` → the answer with its citations and usage, or with
    `stream` the events start, citations, token…, done."""
    if request.method == "OPTIONS":
        return await _preflight(request, slug)
    access = None
    try:
        access, body = await _posted(request, slug)
        channel = Channel.CHAT if access.app_key else Channel.WIDGET
        call = await sync_to_async(answering.prepare, thread_sensitive=False)(
            access=access, channel=channel, query=body.get("query"), stream=body.get("stream", False),
            user=body.get("user"), conversation_id=body.get("conversation_id"))
        if call.stream:
            response = StreamingHttpResponse(_chat_events(call), content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
        else:
            try:
                result = await _collect(call)
            except Exception as exc:
                raise _answer_failed(exc)
            response = JsonResponse(_answer_body(call, result), json_dumps_params={"ensure_ascii": False})
    except ApplicationError as exc:
        response = _error(exc)
    return _with_cors(request, response, access.app if access else None)


@csrf_exempt
async def retrieve(request: HttpRequest, slug: str) -> HttpResponse:
    """`{"query"}` → what the pinned config retrieves for it, with every score and the time each step took."""
    try:
        access, body = await _posted(request, slug)
        call = await sync_to_async(answering.prepare, thread_sensitive=False)(
            access=access, channel=Channel.RETRIEVE, query=body.get("query"), user=body.get("user"))
        try:
            result = await answering.retrieve(call)
        except Exception as exc:
            raise _answer_failed(exc)
    except ApplicationError as exc:
        return _error(exc)
    return JsonResponse({"message_id": str(call.message_id), "queries": result.queries,
                         "hits": answering.public_hits(result), "timings_ms": result.timings_ms})


@csrf_exempt
async def feedback(request: HttpRequest, slug: str) -> HttpResponse:
    """`{"message_id", "rating": "up"|"down", "comment"?}` on one answer of this app."""
    if request.method == "OPTIONS":
        return await _preflight(request, slug)
    access = None
    try:
        access, body = await _posted(request, slug)
        stored = await sync_to_async(services.record_feedback, thread_sensitive=False)(
            app=access.app, message_id=body.get("message_id"), rating=body.get("rating"),
            comment=body.get("comment", ""))
        response = JsonResponse({"message_id": str(body["message_id"]), "rating": "up" if stored.rating > 0 else
                                 "down", "comment": stored.comment})
    except ApplicationError as exc:
        response = _error(exc)
    return _with_cors(request, response, access.app if access else None)


def _text_of(content) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        texts = [part.get("text") for part in content if part.get("type") == "text"]
        if all(isinstance(text, str) for text in texts):
            return "".join(texts)
    return None


def _openai_turn(body: dict) -> tuple[str, list[dict]]:
    """The last user message is the question; the messages before it are the conversation so far."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValidationFailed("'messages' must be a non-empty list of {role, content} objects.",
                               fields={"messages": ["Required."]})
    turns = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise ValidationFailed(f"messages[{index}] needs a 'role', one of {sorted(CHAT_ROLES)}.",
                                   fields={f"messages[{index}].role": ["Invalid."]})
        text = _text_of(message.get("content"))
        if text is None:
            raise ValidationFailed(f"messages[{index}].content must be a string or a list of text parts.",
                                   fields={f"messages[{index}].content": ["Invalid."]})
        turns.append({"role": message["role"], "content": text})
    if turns[-1]["role"] != "user":
        raise ValidationFailed("The last message must come from the user: it is the question the app answers.",
                               fields={"messages": ["The last role must be 'user'."]})
    history = [turn for turn in turns[:-1] if turn["role"] in ("user", "assistant")]
    return turns[-1]["content"], history


def _completion_id(call: answering.Call) -> str:
    return f"chatcmpl-{call.message_id.hex}"


def _chunk(call: answering.Call, created: int, delta: dict, finish_reason=None, **extra) -> str:
    body = {"id": _completion_id(call), "object": "chat.completion.chunk", "created": created,
            "model": call.access.app.slug, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            **extra}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


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
                    yield f"data: {json.dumps(usage)}\n\n"
    except Exception as exc:  # OpenAI's clients raise an APIError on an in-stream error object
        error = {"message": f"The app could not answer: {exc}", "type": "server_error", "code": "answer_failed"}
        yield f"data: {json.dumps({'error': error})}\n\n"
    yield "data: [DONE]\n\n"


@csrf_exempt
async def openai_chat_completions(request: HttpRequest, slug: str) -> HttpResponse:
    """OpenAI's chat/completions: point the official client at /api/apps/<slug>/v1. The answer carries the
    extra fields `citations`, `message_id` and `conversation_id`."""
    try:
        access, body = await _posted(request, slug)
        query, history = _openai_turn(body)
        channel = Channel.OPENAI if access.app_key else Channel.WIDGET
        call = await sync_to_async(answering.prepare, thread_sensitive=False)(
            access=access, channel=channel, query=query, stream=body.get("stream", False), user=body.get("user"),
            conversation_id=body.get("conversation_id"), history=history)
        if call.stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = StreamingHttpResponse(_openai_events(call, include_usage), content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            return response
        try:
            result = await _collect(call)
        except Exception as exc:
            raise _answer_failed(exc)
    except ApplicationError as exc:
        return _openai_error(exc)
    return JsonResponse({
        "id": _completion_id(call), "object": "chat.completion", "created": int(time.time()),
        "model": access.app.slug, "choices": [{"index": 0, "message": {"role": "assistant", "content": result.answer},
                                                 "finish_reason": "stop"}],
        "usage": answering.usage_of(result), "citations": answering.public_citations(result), **_ids(call)},
        json_dumps_params={"ensure_ascii": False})


async def openai_models(request: HttpRequest, slug: str) -> HttpResponse:
    try:
        access = await _authorize(request, slug)
    except ApplicationError as exc:
        return _openai_error(exc)
    return JsonResponse({"object": "list", "data": [
        {"id": access.app.slug, "object": "model", "created": int(access.app.created_at.timestamp()),
         "owned_by": access.app.workspace.slug}]})


async def openai_unknown(request: HttpRequest, slug: str, rest: str) -> HttpResponse:
    return _openai_error(NotFound(f"Unknown endpoint /api/apps/{slug}/v1/{rest}; apps serve chat/completions "
                                  f"and models."))
