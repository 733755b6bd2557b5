"""The apps' public API as a bare ASGI app. factory/asgi.py sends /api/apps/ here ahead of Django: the API needs
none of Django's handler, middleware or URL resolver, which took about as much CPU per request as a whole
retrieval. What each endpoint does lives in runtime/app_api.py, which Django's test client reaches through
`app_api.django_view`."""

import re

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from accounts.errors import ApplicationError, NotFound, ValidationFailed
from runtime.app_api import AppRequest, error_reply, handle
from serving.gateway import Reply
from serving.gateway_asgi import body_limit_exceeded, serve

PREFIX = "/api/apps/"
# The same shape as Django's <slug:slug>/<path:endpoint> in runtime/urls.py.
APP_PATH = re.compile(r"/api/apps/(?P<slug>[-a-zA-Z0-9_]+)/(?P<endpoint>.+)")


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
    host = request.headers.get("host", "")
    domain, _ = split_domain_port(host)
    # What Django's request.get_host() checks on every other path.
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return error_reply(ValidationFailed(f"The Host header '{host}' is not one this server answers to."))
    if too_large := body_limit_exceeded(request):
        return error_reply(RequestTooLarge(too_large))
    return await handle(AppRequest(
        method=request.method, slug=match["slug"], endpoint=match["endpoint"],
        authorization=request.headers.get("authorization", ""), origin=request.headers.get("origin"),
        own_origin=f"{request.url.scheme}://{host}", body=await request.body()))
