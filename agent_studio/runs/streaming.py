"""A run's events for its viewers (the debug chat, the API, a published app's callers), agent runs and workflow runs
alike: from the run's live Redis stream, or, once that has expired, replayed from its stored rows. A viewer whose
stream goes quiet re-reads the run, so a run that ended while nobody watched still ends the viewer's stream."""

import json
from collections.abc import AsyncIterator, Callable

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

from agent_studio import events

# A run's state for a viewer: its status, its payload, and its stored rows (steps or node records) as payloads.
State = tuple[str, dict, list[dict]]


def response(frames: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """A run's events as server-sent events, unbuffered by proxies."""
    return StreamingHttpResponse(frames, content_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def frame(event: str, data, stream_id: str = "") -> bytes:
    head = f"id: {stream_id}\n" if stream_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False, default=str)}\n\n".encode()


async def run_events(public_id, state: Callable[[], State], *, endings: dict[str, str], row_event: str,
                     after: str = "0", block_ms: int = 15_000) -> AsyncIterator[tuple[str, str, dict]]:
    """(stream id, event, data) until the run ends (a status of `endings`, named by its event there); ("", "ping",
    {}) while it is quiet. A run whose stream has expired is replayed: each row as `row_event`, then its ending."""
    if after == "0" and not await sync_to_async(events.stream_exists)(public_id):
        status, payload, rows = await sync_to_async(state)()
        if status in endings:
            for row in rows:
                yield "", row_event, row
            yield "", endings[status], payload
            return
    async for stream_id, event, data in events.follow(public_id, after=after, block_ms=block_ms):
        if event == "ping":
            status, payload, _rows = await sync_to_async(state)()
            if status in endings:
                yield "", endings[status], payload
                return
        yield stream_id, event, data
        if event in events.ENDING:
            return


async def sse(run_events: AsyncIterator[tuple[str, str, dict]]) -> AsyncIterator[bytes]:
    async for stream_id, event, data in run_events:
        yield b": ping\n\n" if event == "ping" else frame(event, data, stream_id)
