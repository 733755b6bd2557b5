"""The apps' public API as a bare ASGI app. factory/asgi.py sends /api/apps/ here ahead of Django (through the
edge's Host check and security headers): the API needs none of Django's handler, middleware or URL resolver, which
took about as much CPU per request as a whole retrieval. What each endpoint does lives in runtime/app_api.py, which
Django's test client reaches through `app_api.django_view`."""

import logging
import re

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from accounts.errors import ApplicationError, NotFound, ServiceUnavailable
from runtime.app_api import AppRequest, error_reply, handle
from serving.gateway import BodyTooLarge, Reply
from serving.gateway_asgi import body_limit_exceeded, body_reader, serve

PREFIX = "/api/apps/"
# The same shape as Django's <slug:slug>/<path:endpoint> in runtime/urls.py.
APP_PATH = re.compile(r"/api/apps/(?P<slug>[-a-zA-Z0-9_]+)/(?P<endpoint>.+)")
logger = logging.getLogger(__name__)


class RequestTooLarge(ApplicationError):
    status = 413
    code = "request_too_large"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one HTTP request whose path starts with /api/apps/."""
    await serve(_reply, scope, receive, send)


async def _reply(request: Request) -> Reply:
    match = APP_PATH.fullmatch(request.scope["path"])
    if match is None:
        return error_reply(NotFound(f"No app API at {request.scope['path']}; use /api/apps/<slug>/chat."))
    if too_large := body_limit_exceeded(request):
        return error_reply(RequestTooLarge(too_large))
    read = body_reader(request)

    async def read_body() -> bytes:
        try:
            return await read()
        except BodyTooLarge as exc:
            raise RequestTooLarge(str(exc))

    try:
        return await handle(AppRequest(
            method=request.method, slug=match["slug"], endpoint=match["endpoint"],
            authorization=request.headers.get("authorization", ""), origin=request.headers.get("origin"),
            client=request.client.host if request.client else None, read_body=read_body))
    except RedisError:
        # Rate limits, caches and the task queue live in Redis: without it no call can be served, for a while.
        logger.exception("Redis failed under the app API")
        return error_reply(ServiceUnavailable("The platform's Redis is not answering; retry in a few seconds."))
