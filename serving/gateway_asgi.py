"""The gateway as a bare ASGI app. factory/asgi.py sends /v1/ here ahead of Django (through the edge's Host check
and security headers): the gateway needs none of Django's handler, middleware or URL resolver, which added about a
fifth to TTFT (issue #3). What the gateway does lives in serving.gateway.dispatch, which the Django view shares."""

from collections.abc import Awaitable, Callable

from django.conf import settings
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from serving.gateway import BodyTooLarge, GatewayError, Reply, dispatch

PREFIX = "/v1/"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one HTTP request whose path starts with /v1/."""
    await serve(_reply, scope, receive, send)


async def serve(reply_to: Callable[[Request], Awaitable[Reply]], scope: Scope, receive: Receive,
                send: Send) -> None:
    """Answer one request with the Reply that `reply_to` makes of it: whole, or streamed. Shared with the apps'
    public API (runtime/app_api_asgi.py)."""
    try:
        reply = await reply_to(Request(scope, receive))
        if isinstance(reply.body, bytes):
            await Response(reply.body, reply.status, reply.headers)(scope, receive, send)
        else:
            await _stream(reply, scope, receive, send)
    except ClientDisconnect:
        pass  # the client hung up: there is no one left to answer


def body_limit() -> int:
    """The lean paths take bodies up to Django's own limit for request data."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def body_limit_exceeded(request: Request) -> str | None:
    """A declared Content-Length past the limit is refused before anything is read or anyone authenticated."""
    declared = request.headers.get("content-length") or "0"
    if not declared.isdigit() or int(declared) > body_limit():
        return f"The request body is larger than {body_limit()} bytes."
    return None


def body_reader(request: Request) -> Callable[[], Awaitable[bytes]]:
    """Reads the body as it arrives, counting bytes and stopping at the limit, whatever Content-Length said (a
    chunked body has none): an endless body never grows past the limit in memory."""

    async def read() -> bytes:
        limit, body = body_limit(), bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise BodyTooLarge(f"The request body is larger than {limit} bytes.")
        return bytes(body)

    return read


async def _reply(request: Request) -> Reply:
    if too_large := body_limit_exceeded(request):
        return GatewayError(413, too_large, code="request_too_large").reply()
    return await dispatch(method=request.method, path=request.scope["path"].removeprefix(PREFIX),
                          authorization=request.headers.get("authorization", ""), read_body=body_reader(request))


async def _stream(reply: Reply, scope: Scope, receive: Receive, send: Send) -> None:
    try:
        await StreamingResponse(reply.body, reply.status, reply.headers)(scope, receive, send)
    finally:
        # A hang-up can stop the response between two chunks, leaving the stream open; closing it closes the
        # upstream stream and records the request.
        await reply.body.aclose()
