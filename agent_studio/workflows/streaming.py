"""A workflow run's events for its viewers (agent_studio/runs/streaming.py): `status`, `node` (a node started, then
its record: done, failed or skipped), then `done`, `error` or `cancelled`."""

from collections.abc import AsyncIterator
from functools import partial

from agent_studio.runs import streaming
from agent_studio.runs.fields import RunStatus
from agent_studio.workflows.models import WorkflowRun
from agent_studio.workflows.runner import node_payload, run_payload

ENDINGS = {RunStatus.DONE: "done", RunStatus.FAILED: "error", RunStatus.CANCELLED: "cancelled"}


def _state(run_pk: int) -> streaming.State:
    run = WorkflowRun.objects.get(pk=run_pk)
    return run.status, run_payload(run), [node_payload(row) for row in run.nodes.all()]


def run_events(run: WorkflowRun, *, after: str = "0") -> AsyncIterator[tuple[str, str, dict]]:
    return streaming.run_events(run.public_id, partial(_state, run.pk), endings=ENDINGS, row_event="node",
                                after=after)


def sse(run: WorkflowRun, *, after: str = "0") -> AsyncIterator[bytes]:
    return streaming.sse(run_events(run, after=after))
