"""A workflow run's events for its viewers: `status`, `node` (a node started, then its record: done, failed or
skipped), then `done`, `error` or `cancelled`; from the run's live Redis stream (agent_studio.events), or, once that
has expired, replayed from its rows."""

from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async

from agent_studio import events
from agent_studio.models import RunStatus
from agent_studio.streaming import frame
from agent_studio.workflows.models import WorkflowRun
from agent_studio.workflows.runner import node_payload, run_payload

ENDINGS = {RunStatus.DONE: "done", RunStatus.FAILED: "error", RunStatus.CANCELLED: "cancelled"}


def _state(run_pk: int) -> tuple[str, dict, list[dict]]:
    run = WorkflowRun.objects.get(pk=run_pk)
    return run.status, run_payload(run), [node_payload(row) for row in run.nodes.all()]


async def run_events(run: WorkflowRun, *, after: str = "0") -> AsyncIterator[tuple[str, str, dict]]:
    if after == "0" and not await sync_to_async(events.stream_exists)(run.public_id):
        status, payload, rows = await sync_to_async(_state)(run.pk)
        if status in ENDINGS:
            for row in rows:
                yield "", "node", row
            yield "", ENDINGS[status], payload
            return
    async for stream_id, event, data in events.follow(run.public_id, after=after):
        if event == "ping":
            status, payload, _rows = await sync_to_async(_state)(run.pk)
            if status in ENDINGS:
                yield "", ENDINGS[status], payload
                return
        yield stream_id, event, data
        if event in events.ENDING:
            return


async def sse(run: WorkflowRun, *, after: str = "0") -> AsyncIterator[bytes]:
    async for stream_id, event, data in run_events(run, after=after):
        yield b": ping\n\n" if event == "ping" else frame(event, data, stream_id)
