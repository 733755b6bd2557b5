import asyncio
import gc
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
# Static files (vendored, no CDN) are served by Django's async static handler, in front of the app, so that no
# sync-only middleware forces a thread hop onto every async view's request.
django_application = ASGIStaticFilesHandler(get_asgi_application())

# The lean apps use the ORM, so they are imported once get_asgi_application() has set Django up.
from django.conf import settings
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from accounts.errors import error_body
from runtime.app_api_asgi import (
    PREFIX as APP_API_PREFIX,
    app as app_api_application,
)
from serving.gateway_asgi import (
    PREFIX as GATEWAY_PREFIX,
    app as gateway_application,
)
from workbridge.mcp_server import (
    PATH as MCP_PATH,
    app as mcp_application,
)


def _import_the_embedding_stack() -> None:
    try:
        import sentence_transformers  # noqa: F401
    finally:
        # What the worker has loaded by now stays for its life: left out of the collector's full passes, which
        # otherwise walk torch's and Django's 800,000 objects and stall every stream of the worker for over half a
        # second each time.
        gc.freeze()


# torch and sentence-transformers take ten seconds and more to import: each web worker does it as it starts, in
# the background, rather than in the first query it is sent.
threading.Thread(target=_import_the_embedding_stack, name="import-embedding-stack", daemon=True).start()

_loops_with_executor: weakref.WeakSet = weakref.WeakSet()


def _use_request_threads() -> None:
    """Give the event loop a default executor of FACTORY_WEB_THREADS threads, where sync_to_async runs ORM and
    retrieval work. asyncio's own has cores + 4: too few for requests that wait there on the shared query
    embedder, which then sees small batches (three queries at concurrency 32, against seven with 32 threads)."""
    loop = asyncio.get_running_loop()
    if loop not in _loops_with_executor:
        _loops_with_executor.add(loop)
        loop.set_default_executor(ThreadPoolExecutor(max_workers=int(os.environ.get("FACTORY_WEB_THREADS", "32")),
                                                      thread_name_prefix="web"))


# What Django's SecurityMiddleware and X-Frame-Options middleware send on its pages, for the lean paths' JSON and
# event streams; nothing there is meant to be framed or rendered as a page.
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'"),
]


class SecurityHeadersMiddleware:
    """Adds SECURITY_HEADERS (and HSTS on HTTPS where settings ask for it) to every lean-path response. Written
    here because Starlette ships no such middleware, and it must stay pure ASGI: a BaseHTTPMiddleware would sit
    between every streamed token and the client."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extra = list(SECURITY_HEADERS)
        if scope.get("scheme") == "https" and getattr(settings, "SECURE_HSTS_SECONDS", 0):
            extra.append((b"strict-transport-security", f"max-age={settings.SECURE_HSTS_SECONDS}; "
                                                        f"includeSubDomains".encode()))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                   *(header for header in extra if header[0] not in present)]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _starlette_host_patterns(django_hosts: list[str]) -> list[str]:
    """Django's ALLOWED_HOSTS in Starlette's spelling: Django's `.example.com` is the domain and its subdomains."""
    patterns = []
    for host in django_hosts:
        if host.startswith("."):
            patterns += [host[1:], f"*{host}"]
        else:
            patterns.append(host)
    return patterns


class DjangoTrustedHostMiddleware(TrustedHostMiddleware):
    """Starlette's Host check against Django's ALLOWED_HOSTS as they stand now (the test runner adds its host,
    and tests change them), so that the lean paths and Django's pages answer to exactly the same names."""

    def __init__(self, app: ASGIApp):
        super().__init__(app, allowed_hosts=["*"], www_redirect=False)
        self._read_from = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hosts = settings.ALLOWED_HOSTS
        if hosts is not self._read_from:
            patterns = _starlette_host_patterns(hosts)
            self.allowed_hosts, self.allow_any, self._read_from = [p.lower() for p in patterns], "*" in patterns, hosts
        await super().__call__(scope, receive, send)


class BodyLimit:
    """Counts a request's body bytes as they arrive and answers 413 past a limit: a declared Content-Length at
    once, a chunked body as soon as it crosses the limit (the app is told the client left, so it stops reading).
    Django reads a whole body (spooling to disk past 2.5 MB) before any view could refuse it, and the MCP SDK
    reads one whole too; the gateway and the apps' API count their own, after authenticating."""

    def __init__(self, app: ASGIApp, *, limit: Callable[[], int], setting: str):
        self.app, self.limit, self.setting = app, limit, setting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit()
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > limit:
            return await self._refuse(scope, receive, send, limit)
        received, refused, started = 0, False, False

        async def counting_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    return {"type": "http.disconnect"}
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counting_receive, watching_send)
        if refused and not started:
            await self._refuse(scope, receive, send, limit)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        body = error_body("request_too_large", f"The request body is larger than {limit} bytes ({self.setting}).")
        await JSONResponse(body, status_code=413)(scope, receive, send)


class _Endpoint:
    """An ASGI app as a Starlette route's endpoint (a plain function would be taken for a request handler)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _lean(app: ASGIApp) -> ASGIApp:
    """A lean path behind the edge's Host check (Django's ALLOWED_HOSTS, as on every Django page) and headers."""
    return DjangoTrustedHostMiddleware(SecurityHeadersMiddleware(app))


def build_edge() -> Router:
    """The one edge: the gateway's, the published apps' and MCP's requests skip Django's handler and middleware (a
    fifth of the gateway's TTFT; half the CPU of an app's retrieval) but not the Host check, the body limits or
    the security headers; everything else, lifespan messages included, goes to Django, under a body limit."""
    mcp = _lean(BodyLimit(mcp_application, limit=lambda: settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
                          setting="DATA_UPLOAD_MAX_MEMORY_SIZE"))
    return Router(routes=[
        Mount(GATEWAY_PREFIX.rstrip("/"), app=_lean(gateway_application)),
        Mount(APP_API_PREFIX.rstrip("/"), app=_lean(app_api_application)),
        Route(MCP_PATH, endpoint=_Endpoint(mcp)),
        Route(f"{MCP_PATH}/", endpoint=_Endpoint(mcp)),
    ], default=BodyLimit(django_application, limit=lambda: settings.MAX_REQUEST_BYTES,
                         setting="FACTORY_MAX_REQUEST_BYTES"), redirect_slashes=False)


edge = build_edge()


async def application(scope, receive, send):
    _use_request_threads()
    if scope["type"] != "http":
        return await django_application(scope, receive, send)
    return await edge(scope, receive, send)
