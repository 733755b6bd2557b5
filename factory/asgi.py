import asyncio
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
# Static files (vendored, no CDN) are served by Django's async static handler, in front of the app, so that no
# sync-only middleware forces a thread hop onto every async view's request.
django_application = ASGIStaticFilesHandler(get_asgi_application())

# The lean apps use the ORM, so they are imported once get_asgi_application() has set Django up.
from runtime.app_api_asgi import PREFIX as APP_API_PREFIX, app as app_api_application  # noqa: E402
from serving.gateway_asgi import PREFIX as GATEWAY_PREFIX, app as gateway_application  # noqa: E402
from workbridge.mcp_server import PATH as MCP_PATH, app as mcp_application  # noqa: E402


def _import_the_embedding_stack() -> None:
    import sentence_transformers  # noqa: F401


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


async def application(scope, receive, send):
    """The gateway's, the published apps' and MCP's requests skip Django's handler and middleware (a fifth of the
    gateway's TTFT; half the CPU of an app's retrieval); everything else, lifespan and websocket messages
    included, goes to Django as before."""
    _use_request_threads()
    if scope["type"] == "http":
        if scope["path"].startswith(GATEWAY_PREFIX):
            return await gateway_application(scope, receive, send)
        if scope["path"].startswith(APP_API_PREFIX):
            return await app_api_application(scope, receive, send)
        if scope["path"].rstrip("/") == MCP_PATH:
            return await mcp_application(scope, receive, send)
    return await django_application(scope, receive, send)
