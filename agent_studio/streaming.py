"""A run's events for its viewers (the debug chat, the API, a published app's callers): from the run's live Redis
stream, or, once that has expired, replayed from its stored steps. A viewer whose stream goes quiet re-reads the run,
so a run that ended while nobody watched still ends the viewer's stream."""

import json
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

from agent_studio import events
from agent_studio.models import AgentRun, RunStatus
from agent_studio.runner import run_payload
from agent_studio.tracing import step_payload

ENDINGS = {RunStatus.DONE: "done", RunStatus.FAILED: "error", RunStatus.CANCELLED: "cancelled",
           RunStatus.AWAITING_APPROVAL: "plan"}


def response(frames: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """A run's events as server-sent events, unbuffered by proxies (agent runs and workflow runs alike)."""
    return StreamingHttpResponse(frames, content_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def frame(event: str, data, stream_id: str = "") -> bytes:
    head = f"id: {stream_id}\n" if stream_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False, default=str)}\n\n".encode()


def _state(run_pk: int) -> tuple[str, dict, list[dict]]:
    run = AgentRun.objects.select_related("thread").get(pk=run_pk)
    return run.status, run_payload(run), [step_payload(step) for step in run.steps.all()]


async def run_events(run: AgentRun, *, after: str = "0", block_ms: int = 15_000
                     ) -> AsyncIterator[tuple[str, str, dict]]:
    """(stream id, event, data) until the run ends or pauses; ("", "ping", {}) while it is quiet."""
    if after == "0" and not await sync_to_async(events.stream_exists)(run.public_id):
        status, payload, steps = await sync_to_async(_state)(run.pk)
        if status in ENDINGS:
            for step in steps:
                yield "", "step", step
            yield "", ENDINGS[status], payload
            return
    async for stream_id, event, data in events.follow(run.public_id, after=after, block_ms=block_ms):
        if event == "ping":
            status, payload, _steps = await sync_to_async(_state)(run.pk)
            if status in ENDINGS:
                yield "", ENDINGS[status], payload
                return
        yield stream_id, event, data
        if event in events.ENDING:
            return


async def sse(run: AgentRun, *, after: str = "0") -> AsyncIterator[bytes]:
    async for stream_id, event, data in run_events(run, after=after):
        yield b": ping\n\n" if event == "ping" else frame(event, data, stream_id)
