"""Stopping work that blocks a thread the moment it is cancelled, for work that may be cancelled while it runs (an
agent or workflow run).

Python cannot interrupt a thread, but it can end what the thread waits on. So whoever may be cancelled makes a
Cancellation and makes it current (`scope`: a context variable, which LangGraph's and LangChain's worker threads copy),
and whatever blocks registers, for as long as it blocks, how to end its wait (`stopping`): the code sandbox kills its
process group; an HTTP request made through CancellableTransport shuts its connection, so that the reading thread
wakes at once and the server sees its client gone (the gateway then frees the engine's slot). Another thread (the one
that learns of the cancel) calls `cancel`; each blocked call then returns or raises with its own error, which its
caller reads as cancelled by asking `cancelled`."""

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar

import httpx

logger = logging.getLogger(__name__)
_current: ContextVar["Cancellation | None"] = ContextVar("cancellation", default=None)


class Cancellation:
    """Cancelled once, by any thread. `cancel` runs every registered stop; a stop registered after that runs as it
    registers. Stops run under the lock that taking one back takes, so once `stopping` has exited, its stop can no
    longer run (a process reaped meanwhile is never signalled)."""

    def __init__(self):
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._stops: dict[int, Callable[[], None]] = {}
        self._next = 0

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to `timeout_s`, waking when cancelled; whether it was."""
        return self._cancelled.wait(timeout_s)

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled.is_set():
                return
            self._cancelled.set()
            stops, self._stops = list(self._stops.values()), {}
            for stop in stops:
                _run(stop)

    @contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """Meanwhile, `stop` ends the caller's wait when this is cancelled."""
        release = self._add(stop)
        try:
            yield
        finally:
            release()

    def _add(self, stop: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            if self._cancelled.is_set():
                _run(stop)
                return lambda: None
            key, self._next = self._next, self._next + 1
            self._stops[key] = stop

        def release() -> None:
            with self._lock:
                self._stops.pop(key, None)

        return release


def _run(stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception:  # one stop failing must not keep the others from running
        logger.exception("A cancelled call could not be stopped")


def current() -> Cancellation | None:
    return _current.get()


def cancelled() -> bool:
    """Whether the current Cancellation (if any) was cancelled."""
    found = _current.get()
    return found is not None and found.cancelled


@contextmanager
def scope(cancellation: Cancellation) -> Iterator[Cancellation]:
    """Make `cancellation` current meanwhile. Inside another one's scope it is cancelled with that one too (an agent
    run in a workflow's agent node stops with the workflow run)."""
    outer = _current.get()
    token = _current.set(cancellation)
    try:
        with outer.stopping(cancellation.cancel) if outer is not None else nullcontext():
            yield cancellation
    finally:
        _current.reset(token)


def stopping(stop: Callable[[], None]):
    """`Cancellation.stopping` on the current Cancellation; nothing to do where there is none."""
    found = _current.get()
    return found.stopping(stop) if found is not None else nullcontext()


class CancellableTransport(httpx.BaseTransport):
    """httpx's own transport, each request on a connection of its own, which the current Cancellation shuts until
    the response is closed. httpcore's `trace` extension hands over each new connection's socket (its TLS socket
    once wrapped); a pooled connection could not be found again, hence a connection per request."""

    def __init__(self, **options):
        self._inner = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0), **options)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        cancellation = _current.get()
        if cancellation is None:
            return self._inner.handle_request(request)
        sockets: list[socket.socket] = []
        traced = request.extensions.get("trace")

        def trace(event: str, info: dict) -> None:
            if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
                sockets.append(info["return_value"].get_extra_info("socket"))
            if traced is not None:
                traced(event, info)

        def shut() -> None:
            for sock in sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed already

        request.extensions = {**request.extensions, "trace": trace}
        release = cancellation._add(shut)
        try:
            response = self._inner.handle_request(request)
        except BaseException:
            release()
            raise
        response.stream = _Releasing(response.stream, release)
        return response

    def close(self) -> None:
        self._inner.close()


class _Releasing(httpx.SyncByteStream):
    """A response body that takes its connection's stop back once closed."""

    def __init__(self, stream, release: Callable[[], None]):
        self._stream, self._release = stream, release

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._release()
