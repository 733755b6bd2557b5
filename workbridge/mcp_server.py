"""Work Bridge as an MCP server: `/mcp` (streamable HTTP) offers a workspace's tools to outside MCP clients.

A client authenticates with a workspace API key (`Authorization: Bearer afk_…`) and sees that workspace's tools;
calls go through `invoke_tool` (schema-checked, guarded, recorded with caller "mcp") with the key's role. Host and
Origin headers are checked against the names this platform answers to, so a web page on another name cannot reach
a platform on loopback through DNS rebinding. factory/asgi.py sends /mcp here ahead of Django.
"""

import asyncio
import json

from asgiref.sync import sync_to_async
from django.conf import settings
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from accounts.errors import ApplicationError, Unauthenticated
from accounts.models import Role
from accounts.services import Actor, authenticate_api_key, require_role
from workbridge import services
from workbridge.models import Tool

PATH = "/mcp"
ACTOR = "aifactory.actor"

server = Server("ai-factory-work-bridge")


def _actor() -> Actor:
    return server.request_context.request.scope[ACTOR]


def _workspace_tools(actor: Actor) -> list[Tool]:
    require_role(actor=actor, workspace=actor.api_key.workspace, role=Role.VIEWER)
    return list(Tool.objects.filter(workspace=actor.api_key.workspace).select_related("workspace", "mcp_server",
                                                                                      "spec"))


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    tools = await sync_to_async(_workspace_tools, thread_sensitive=False)(_actor())
    return [types.Tool(name=tool.name, description=tool.description, inputSchema=tool.parameters) for tool in tools]


def _invoke(actor: Actor, name: str, arguments: dict):
    tool = Tool.objects.select_related("workspace", "mcp_server", "spec").filter(
        workspace=actor.api_key.workspace, name=name).first()
    if tool is None:
        raise ValueError(f"This workspace has no tool '{name}'.")
    try:
        result = services.invoke_tool(actor=actor, tool=tool, arguments=arguments, caller="mcp")
    except ApplicationError as exc:
        raise ValueError(exc.message) from exc
    if not result.ok:
        raise ValueError(result.invocation.error)
    return result.output


# Arguments are checked by invoke_tool against the calling workspace's tool; the SDK's own check would use a cache
# of tool definitions shared by every workspace.
@server.call_tool(validate_input=False)
async def call_tool(name: str, arguments: dict):
    output = await sync_to_async(_invoke, thread_sensitive=False)(_actor(), name, arguments)
    if isinstance(output, dict):
        return output
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    return [types.TextContent(type="text", text=text)]


def _security() -> TransportSecuritySettings:
    hosts = [host for host in settings.MCP_ALLOWED_HOSTS if host]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts + [f"{host}:*" for host in hosts if not host.endswith(":*")],
        allowed_origins=[f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
        + [f"{scheme}://{host}:*" for host in hosts for scheme in ("http", "https")])


_manager: StreamableHTTPSessionManager | None = None
_manager_ready: asyncio.Event | None = None


async def _running_manager() -> StreamableHTTPSessionManager:
    """The session manager, started on the first request: Django's ASGI handler has no lifespan to start it in.
    Stateless, so any web worker can answer any request."""
    global _manager, _manager_ready
    if _manager is None:
        _manager = StreamableHTTPSessionManager(app=server, json_response=True, stateless=True,
                                                security_settings=_security())
        _manager_ready = asyncio.Event()

        async def keep_running():
            async with _manager.run():
                _manager_ready.set()
                await asyncio.Event().wait()

        asyncio.get_running_loop().create_task(keep_running(), name="mcp-session-manager")
    await _manager_ready.wait()
    return _manager


def _authenticate(authorization: str) -> Actor:
    if not authorization.lower().startswith("bearer "):
        raise Unauthenticated("Send a workspace API key: 'Authorization: Bearer <key>'.")
    api_key = authenticate_api_key(raw=authorization[7:].strip())
    return Actor(user=api_key.created_by, api_key=api_key)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
    try:
        actor = await sync_to_async(_authenticate, thread_sensitive=False)(headers.get("authorization", ""))
    except Unauthenticated as exc:
        reply = JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=401,
                             headers={"WWW-Authenticate": "Bearer"})
        return await reply(scope, receive, send)
    manager = await _running_manager()
    await manager.handle_request({**scope, ACTOR: actor}, receive, send)
