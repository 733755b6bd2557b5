"""An agent run's events for its viewers (agent_studio/runs/streaming.py): each step, then `done`, `error`,
`cancelled`, or `plan` when the run waits for its plan's approval."""

from collections.abc import AsyncIterator
from functools import partial

from agent_studio.models import AgentRun
from agent_studio.runner import run_payload
from agent_studio.runs import streaming
from agent_studio.runs.fields import RunStatus
from agent_studio.tracing import step_payload

ENDINGS = {RunStatus.DONE: "done", RunStatus.FAILED: "error", RunStatus.CANCELLED: "cancelled",
           RunStatus.AWAITING_APPROVAL: "plan"}


def _state(run_pk: int) -> streaming.State:
    run = AgentRun.objects.select_related("thread").get(pk=run_pk)
    return run.status, run_payload(run), [step_payload(step) for step in run.steps.all()]


def run_events(run: AgentRun, *, after: str = "0", block_ms: int = 15_000) -> AsyncIterator[tuple[str, str, dict]]:
    """(stream id, event, data) until the run ends or pauses; ("", "ping", {}) while it is quiet."""
    return streaming.run_events(run.public_id, partial(_state, run.pk), endings=ENDINGS, row_event="step",
                                after=after, block_ms=block_ms)


def sse(run: AgentRun, *, after: str = "0") -> AsyncIterator[bytes]:
    return streaming.sse(run_events(run, after=after))
