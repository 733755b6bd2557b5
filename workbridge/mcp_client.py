"""Work Bridge as an MCP client: list and call the tools of a registered MCP server, with the official `mcp` SDK.

An HTTP server is reached through the egress guard (its httpx client checks and pins every request); a stdio server
is a local command from the operator's catalogue, started in the sandbox (workbridge/mcp_catalogue.py). Each listing
or call opens its own session and closes it: nothing is held between calls, so a server that went away costs one
failed call, never a wedged worker.
"""

import asyncio
import json
import os
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from workbridge import egress
from workbridge.egress import Allowlist

# What a stdio server inherits of the platform's environment: enough to find its interpreter, none of the
# platform's own secrets (FACTORY_SECRETS_KEY, DATABASE_URL).
STDIO_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")


class McpUnreachable(Exception):
    pass


@dataclass(frozen=True)
class Connection:
    transport: str  # "http" or "stdio"
    url: str = ""
    command: tuple[str, ...] = ()
    # What a stdio server gets beyond STDIO_ENV (its catalogue entry's `env`).
    env: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    allowlist: Allowlist = Allowlist()
    timeout_s: float = 30.0


@dataclass(frozen=True)
class RemoteTool:
    name: str
    description: str
    input_schema: dict


@dataclass(frozen=True)
class Reply:
    output: object
    error: str = ""


def list_tools(connection: Connection) -> list[RemoteTool]:
    async def listing(session: ClientSession) -> list[RemoteTool]:
        tools, cursor = [], None
        while True:
            page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            tools += [RemoteTool(tool.name, tool.description or "", dict(tool.inputSchema or {}))
                      for tool in page.tools]
            cursor = page.nextCursor
            if not cursor:
                return tools

    return _run(connection, listing)


def call_tool(connection: Connection, name: str, arguments: dict, *, timeout_s: float) -> Reply:
    """The tool's answer: its structured content if it gave one, else its text; a tool that reports an error
    (isError) comes back as Reply.error."""
    async def calling(session: ClientSession) -> Reply:
        result = await session.call_tool(name, arguments, read_timeout_seconds=timedelta(seconds=timeout_s))
        text = "\n".join(part.text for part in result.content if getattr(part, "type", "") == "text")
        if result.isError:
            return Reply(output=None, error=f"The MCP tool reported an error: {text or 'no message'}")
        if result.structuredContent is not None:
            return Reply(output=result.structuredContent)
        others = [part.model_dump(mode="json") for part in result.content if getattr(part, "type", "") != "text"]
        return Reply(output=text if not others else json.dumps(others, ensure_ascii=False) + text)

    return _run(connection, calling, timeout_s=timeout_s)


def _run(connection: Connection, work, *, timeout_s: float | None = None):
    """Run `work(session)` in a session of its own, on an event loop of this thread's own (callers are sync:
    DRF views, Celery tasks, LangChain tool runs), within the connection's timeout."""
    limit = (timeout_s or connection.timeout_s) + connection.timeout_s

    async def session_then_work():
        async with _session(connection) as session:
            await session.initialize()
            return await work(session)

    try:
        return asyncio.run(asyncio.wait_for(session_then_work(), timeout=limit))
    except TimeoutError as exc:
        raise McpUnreachable(f"The MCP server did not answer within {limit:g} s.") from exc
    except McpUnreachable:
        raise
    except BaseException as exc:  # anyio wraps transport failures in ExceptionGroups
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise McpUnreachable(f"The MCP server could not be used: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{exc.__class__.__name__}: {exc}".rstrip(": ")


@asynccontextmanager
async def _session(connection: Connection):
    """A ClientSession over the connection's transport, closed with everything under it."""
    async with AsyncExitStack() as stack:
        if connection.transport == "stdio":
            parameters = StdioServerParameters(command=connection.command[0], args=list(connection.command[1:]),
                                               env={k: os.environ[k] for k in STDIO_ENV if k in os.environ}
                                               | connection.env)
            read, write = await stack.enter_async_context(stdio_client(parameters))
        else:
            client = await stack.enter_async_context(egress.guarded_async_client(
                allowlist=connection.allowlist, headers=connection.headers, timeout_s=connection.timeout_s))
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(connection.url, http_client=client))
        yield await stack.enter_async_context(ClientSession(read, write))
