"""Work Bridge as an MCP client: list and call the tools of a registered MCP server, with the official `mcp` SDK.

An HTTP server is reached through the egress guard (its httpx client checks and pins every request); a stdio server
is a local command from the operator's catalogue, started in the sandbox (workbridge/mcp_catalogue.py).

A connection with a `pool_key` (every registered server's) is used through this process's pool: one open session
per server, kept by a background event loop thread, so that a call costs a round trip instead of starting a process
(1-2 s for a Python server). A session is checked before it is reused (its process still running; a ping after
PING_AFTER_IDLE_S unused), started afresh after a failure, replaced when the connection changes (its settings, the
catalogue entry, a secret), closed after FACTORY_MCP_POOL_IDLE_S unused, and at most FACTORY_MCP_POOL_SIZE are open,
the least recently used closed beyond that. The pool is per process: a forked child (a Celery prefork worker) starts
with an empty one and never touches its parent's sessions. A connection without a pool_key (or a pool size of 0)
opens a session for the one listing or call and closes it.
"""

import asyncio
import atexit
import json
import os
import threading
import time
from collections import OrderedDict, defaultdict
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import psutil
from django.conf import settings
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND

from workbridge import egress
from workbridge.egress import Allowlist

# What a stdio server inherits of the platform's environment: enough to find its interpreter, none of the
# platform's own secrets (FACTORY_SECRETS_KEY, DATABASE_URL).
STDIO_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")
# A pooled session unused this long is pinged before it is trusted with a call (an HTTP server may have gone).
PING_AFTER_IDLE_S = 5.0
PING_TIMEOUT_S = 5.0
# How long closing a session may take: a stdio server gets 2 s after its stdin closes, then is killed.
CLOSE_TIMEOUT_S = 5.0
# Errors about a request that leave its session usable: the server answered (an unknown tool, bad arguments, its own
# failure), or took longer than the call's timeout. Any other (the connection closed, the server forgot the session
# on a restart) closes the session.
SESSION_KEPT_AFTER = {METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR, 408}


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
    # Which pooled session serves this connection (one per key and process); blank: a session per call.
    pool_key: str = ""


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
    """Run `work(session)` within the connection's timeout, in the pooled session of its pool_key or else in a
    session of its own on an event loop of this thread's own (callers are sync: DRF views, Celery tasks, LangChain
    tool runs)."""
    limit = (timeout_s or connection.timeout_s) + connection.timeout_s
    if connection.pool_key and settings.MCP_POOL_SIZE > 0:
        return _the_pool().run(connection, work, limit)

    async def session_then_work():
        async with _session(connection) as (session, _):
            await session.initialize()
            return await work(session)

    try:
        return asyncio.run(asyncio.wait_for(session_then_work(), timeout=limit))
    except BaseException as exc:
        if (translated := _unreachable(exc, limit)) is exc:
            raise
        raise translated from exc


def _unreachable(exc: BaseException, limit: float) -> BaseException:
    """What a failure to list or call means for the user (anyio wraps transport failures in ExceptionGroups)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
        return exc
    if isinstance(exc, McpUnreachable):
        return McpUnreachable(str(exc))
    if isinstance(exc, TimeoutError):
        return McpUnreachable(f"The MCP server did not answer within {limit:g} s.")
    return McpUnreachable(f"The MCP server could not be used: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{exc.__class__.__name__}: {exc}".rstrip(": ")


@asynccontextmanager
async def _session(connection: Connection, spawning: asyncio.Lock | None = None, on_http_failure=None):
    """A ClientSession over the connection's transport, closed with everything under it, and the stdio server's
    process (psutil's, None for HTTP). `spawning`, when given, is held while the process starts, so that the new
    child of this process running the command is the one just started. `on_http_failure(exc)` hears of an HTTP
    request that failed (a refused connection): the SDK passes it on as a message and leaves the call waiting."""
    async with AsyncExitStack() as stack:
        process, message_handler = None, None
        if connection.transport == "stdio":
            parameters = StdioServerParameters(command=connection.command[0], args=list(connection.command[1:]),
                                               env={k: os.environ[k] for k in STDIO_ENV if k in os.environ}
                                               | connection.env)
            if spawning is None:
                read, write = await stack.enter_async_context(stdio_client(parameters))
            else:
                async with spawning:
                    before = {child.pid for child in psutil.Process().children()}
                    read, write = await stack.enter_async_context(stdio_client(parameters))
                    process = _started_child(before, list(connection.command[1:]))
        else:
            client = await stack.enter_async_context(egress.guarded_async_client(
                allowlist=connection.allowlist, headers=connection.headers, timeout_s=connection.timeout_s))
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(connection.url, http_client=client))
            if on_http_failure is not None:
                async def message_handler(message) -> None:
                    if isinstance(message, Exception):
                        on_http_failure(message)
        yield await stack.enter_async_context(ClientSession(read, write, message_handler=message_handler)), process


def _started_child(before: set[int], args: list[str]) -> psutil.Process | None:
    """The child process started since `before` with these arguments (the SDK keeps its process to itself)."""
    for child in psutil.Process().children():
        try:
            if child.pid not in before and child.cmdline()[1:] == args:
                return child
        except psutil.Error:
            continue
    return None


class _Pooled:
    """One open session and the task that holds it open: anyio's scopes must be left by the task that entered
    them, so a session is opened, held and closed by a task of its own, and calls from other tasks share it."""

    def __init__(self, connection: Connection, loop: asyncio.AbstractEventLoop):
        self.connection = connection
        self.session: ClientSession | None = None
        self.process: psutil.Process | None = None
        self.ready = loop.create_future()
        # A start that failed after its caller gave up waiting must not be logged as an unretrieved exception.
        self.ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        self.released = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.last_used = time.monotonic()
        self.in_use = 0
        # The calls under way, and why the transport failed under them (they are then stopped: see _use).
        self.calls: set[asyncio.Future] = set()
        self.failure: BaseException | None = None

    def transport_failed(self, exc: BaseException) -> None:
        self.failure = exc
        for call in self.calls:
            call.cancel()

    async def hold(self, spawning: asyncio.Lock) -> None:
        try:
            async with _session(self.connection, spawning, self.transport_failed) as (session, process):
                await session.initialize()
                self.session, self.process = session, process
                if not self.ready.done():
                    self.ready.set_result(session)
                await self.released.wait()
        except asyncio.CancelledError:
            if not self.ready.done():
                self.ready.cancel()
            raise
        except BaseException as exc:  # the start failed (ready carries why), or the transport broke while held
            if not self.ready.done():
                self.ready.set_exception(exc)
            else:
                self.transport_failed(exc)

    async def healthy(self) -> bool:
        """Whether a call may use the session: its holder still holds it, its process runs, and, after a while
        unused, it answers a ping."""
        if self.task is None or self.task.done() or self.session is None or self.failure is not None:
            return False
        if self.process is not None:
            try:
                if not self.process.is_running() or self.process.status() == psutil.STATUS_ZOMBIE:
                    return False
            except psutil.Error:
                return False
        if time.monotonic() - self.last_used > PING_AFTER_IDLE_S:
            try:
                await asyncio.wait_for(self.session.send_ping(), PING_TIMEOUT_S)
            except Exception:
                return False
        return True


class SessionPool:
    """This process's open MCP sessions, on an event loop of their own in a daemon thread; sync callers submit work
    to it and wait."""

    def __init__(self):
        self.owner_pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-session-pool", daemon=True)
        self._thread.start()
        self._sessions: OrderedDict[str, _Pooled] = OrderedDict()  # least recently used first
        self._starting: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._spawning = asyncio.Lock()
        self._closing: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None

    def run(self, connection: Connection, work, limit: float):
        future = asyncio.run_coroutine_threadsafe(self._use(connection, work, limit), self._loop)
        try:
            return future.result(timeout=limit + CLOSE_TIMEOUT_S)
        except TimeoutError as exc:
            future.cancel()
            raise McpUnreachable(f"The MCP server did not answer within {limit:g} s.") from exc

    def close(self, pool_key: str | None = None) -> None:
        """Close the session of `pool_key` (every session when None) and wait until it is closed."""
        asyncio.run_coroutine_threadsafe(self._close_now(pool_key), self._loop).result(timeout=2 * CLOSE_TIMEOUT_S)

    def processes(self) -> dict[str, int | None]:
        """The open sessions' keys and their stdio server's process id (None for HTTP)."""
        async def listing():
            return {key: pooled.process.pid if pooled.process else None for key, pooled in self._sessions.items()
                    if pooled.ready.done() and not pooled.ready.cancelled() and pooled.ready.exception() is None}
        return asyncio.run_coroutine_threadsafe(listing(), self._loop).result(timeout=CLOSE_TIMEOUT_S)

    async def _use(self, connection: Connection, work, limit: float):
        try:
            async with asyncio.timeout(limit):
                pooled = await self._checkout(connection)
                pooled.in_use += 1
                call = asyncio.ensure_future(work(pooled.session))
                pooled.calls.add(call)
                try:
                    return await call
                except asyncio.CancelledError:
                    if pooled.failure is None or asyncio.current_task().cancelling():
                        raise  # timed out: a slow server keeps its session
                    self._discard(connection.pool_key, pooled)
                    raise McpUnreachable(f"The MCP server could not be used: {_reason(pooled.failure)}. Its session "
                                         f"is closed; the next call starts it afresh.") from None
                except BaseException as exc:
                    # The next call after any other error starts the server (or the HTTP session) afresh.
                    if not (isinstance(exc, McpError) and exc.error.code in SESSION_KEPT_AFTER):
                        self._discard(connection.pool_key, pooled)
                        raise McpUnreachable(f"The MCP server could not be used: {_reason(exc)}. Its session is "
                                             f"closed; the next call starts it afresh.") from exc
                    raise
                finally:
                    pooled.calls.discard(call)
                    pooled.in_use -= 1
                    pooled.last_used = time.monotonic()
        except BaseException as exc:
            if (translated := _unreachable(exc, limit)) is exc:
                raise
            raise translated from exc

    async def _checkout(self, connection: Connection) -> _Pooled:
        key = connection.pool_key
        async with self._starting[key]:
            pooled = self._sessions.get(key)
            if pooled is not None and (pooled.connection != connection or not await pooled.healthy()):
                self._discard(key, pooled)
                pooled = None
            if pooled is None:
                pooled = _Pooled(connection, self._loop)
                self._sessions[key] = pooled
                pooled.task = asyncio.create_task(pooled.hold(self._spawning))
                try:
                    await asyncio.shield(pooled.ready)
                except BaseException:
                    self._discard(key, pooled)
                    raise
            self._sessions.move_to_end(key)
            self._evict_beyond(settings.MCP_POOL_SIZE, keep=key)
            if self._reaper is None or self._reaper.done():
                self._reaper = asyncio.create_task(self._reap_idle())
            return pooled

    def _discard(self, key: str, pooled: _Pooled) -> None:
        """Take the session out of the pool and close it in the background."""
        if self._sessions.get(key) is pooled:
            del self._sessions[key]
        pooled.released.set()
        if pooled.task is not None and not pooled.task.done():
            self._closing.add(pooled.task)
            pooled.task.add_done_callback(self._closing.discard)

    def _evict_beyond(self, bound: int, *, keep: str) -> None:
        """Close the least recently used sessions beyond `bound`; one in use is passed over (its call finishes)."""
        idle = [(key, pooled) for key, pooled in self._sessions.items() if not pooled.in_use and key != keep]
        for key, pooled in idle[:max(0, len(self._sessions) - bound)]:
            self._discard(key, pooled)

    async def _reap_idle(self) -> None:
        while self._sessions:
            idle_s = settings.MCP_POOL_IDLE_S
            await asyncio.sleep(min(5.0, max(0.05, idle_s / 4)))
            now = time.monotonic()
            for key, pooled in list(self._sessions.items()):
                if not pooled.in_use and pooled.ready.done() and now - pooled.last_used > idle_s:
                    self._discard(key, pooled)

    async def _close_now(self, pool_key: str | None) -> None:
        for key, pooled in list(self._sessions.items()):
            if pool_key is None or key == pool_key:
                self._discard(key, pooled)
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=CLOSE_TIMEOUT_S)


_pool: SessionPool | None = None
_pool_lock = threading.Lock()


def _the_pool() -> SessionPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SessionPool()
        return _pool


def close_session(pool_key: str) -> None:
    """Close the pooled session of `pool_key` in this process, if there is one (its server was edited, disabled or
    deleted); another process replaces its own at its next call, when the connection differs, or closes it idle."""
    if _pool is not None:
        _pool.close(pool_key)


def close_all() -> None:
    if _pool is not None:
        _pool.close()


def pooled_processes() -> dict[str, int | None]:
    """This process's pooled sessions: key -> the stdio server's process id (None for an HTTP server)."""
    return _pool.processes() if _pool is not None else {}


def _forget_pool_after_fork() -> None:
    """A forked child has no pool thread: it starts its own pool, and leaves its parent's sessions alone."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


def _close_at_exit() -> None:
    if _pool is not None and _pool.owner_pid == os.getpid():
        try:
            _pool.close()
        except Exception:  # exiting anyway; the sandbox's die-with-parent ends what is left
            pass


os.register_at_fork(after_in_child=_forget_pool_after_fork)
atexit.register(_close_at_exit)
