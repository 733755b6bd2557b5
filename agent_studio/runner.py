"""Running one AgentRun, in a Celery worker: claim it (agent_studio/runs/leases.py), build its graph, run it to an
answer, a pause for plan approval, or a recorded failure, and publish each step live.

The conversation's checkpoint is the run's memory of where it is: a run whose worker died is claimed again when its
lease runs out (agent_studio.tasks.resume_stalled_runs) and continues from its last checkpoint, so tool calls that
completed are not made again. A run is claimed at most MAX_ATTEMPTS times.
"""

import logging
import time

from django.utils import timezone
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.errors import GraphRecursionError
from langgraph.types import Command

from accounts.services import Actor
from agent_studio import events, graphs, memory
from agent_studio.graphs import PlanUnreadable
from agent_studio.models import AgentRun, StepKind
from agent_studio.runs import cancel, leases
from agent_studio.runs.fields import RunStatus
from agent_studio.strategies import GatewayError, ToolReplyInvalid
from agent_studio.toolkit import BindingMissing, RunContext
from agent_studio.tracing import Recorder, RunCancelled, RunLimitReached

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 3
FINISHED = object()
EXPECTED_FAILURES = (RunLimitReached, ToolReplyInvalid, PlanUnreadable, BindingMissing)


def run_payload(run: AgentRun) -> dict:
    return {"run_id": str(run.public_id), "status": run.status, "answer": run.answer, "error": run.error,
            "plan": run.plan, "citations": run.citations,
            "thread_id": str(run.thread.public_id) if run.thread else None,
            "usage": {"model_calls": run.model_calls, "tool_calls": run.tool_calls,
                      "input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
            "latency_ms": run.latency_ms}


def _finish(run: AgentRun, owner: str, status: str, *, answer: str = "", error: str = "",
            citations: list | None = None, elapsed_ms: float = 0.0) -> None:
    fields = {"status": status, "answer": answer, "error": error[:4000], "finished_at": timezone.now(),
              "lease_until": None, "latency_ms": (run.latency_ms or 0.0) + elapsed_ms}
    if citations is not None:
        fields["citations"] = citations
    if not AgentRun.objects.filter(pk=run.pk, lease_owner=owner).update(**fields):
        return  # another worker took the run over; its outcome stands
    run.refresh_from_db()
    event = {RunStatus.DONE: "done", RunStatus.CANCELLED: "cancelled"}.get(status, "error")
    events.publish(run.public_id, event, run_payload(run))


def _pause(run: AgentRun, owner: str, plan: list[str], citations: list, elapsed_ms: float) -> None:
    AgentRun.objects.filter(pk=run.pk, lease_owner=owner).update(
        status=RunStatus.AWAITING_APPROVAL, plan=plan, citations=citations, lease_until=None,
        latency_ms=(run.latency_ms or 0.0) + elapsed_ms)
    run.refresh_from_db()
    events.publish(run.public_id, "plan", run_payload(run))


def _first_input(run: AgentRun) -> dict:
    prior = [HumanMessage(content=turn["content"]) if turn.get("role") == "user" else
             AIMessage(content=turn["content"]) for turn in run.prior_messages]
    return {"messages": [*prior, HumanMessage(content=run.input, id=f"run-{run.public_id}")]}


def _graph_input(graph, config: dict, run: AgentRun, resume):
    """Resume a paused plan; continue a run from its checkpoint if its message is already in the thread;
    otherwise start it."""
    if resume is not None:
        return Command(resume=resume)
    state = graph.get_state(config)
    marker = f"run-{run.public_id}"
    if not any(getattr(message, "id", None) == marker for message in state.values.get("messages", [])):
        return _first_input(run)
    return None if state.next else FINISHED


def execute(run_pk: int, *, owner: str, resume=None, extra_tools: list | None = None, extra_prompt: str = "") -> None:
    """Run, resume or continue the run. `extra_tools` and `extra_prompt` are an evaluation probe's, for this run
    only."""
    run = leases.claim(AgentRun, run_pk, owner, related=("agent", "version", "thread", "created_by"))
    if run is None:
        return
    started = time.perf_counter()

    def elapsed() -> float:
        return (time.perf_counter() - started) * 1000

    with leases.kept(AgentRun, run.pk, owner), cancel.watched(AgentRun, run.pk) as cancellation:
        recorder = Recorder(run, owner=owner, cancellation=cancellation)
        if run.attempts > MAX_ATTEMPTS:
            _fail(run, owner, recorder,
                  f"The run was interrupted {MAX_ATTEMPTS} times (its worker stopped); giving up.", elapsed())
            return
        context = RunContext(actor=Actor(user=run.created_by), workspace_id=run.agent.workspace_id,
                             agent_id=run.agent_id, agent_name=run.agent.name, thread=run.thread,
                             settings=run.version.settings, recorder=recorder, citations=list(run.citations),
                             extra_tools=list(extra_tools or []), extra_prompt=extra_prompt)
        _run_graph(run, owner, recorder, context, resume, elapsed)


def _run_graph(run: AgentRun, owner: str, recorder: Recorder, context: RunContext, resume, elapsed) -> None:
    try:
        built = graphs.build(context, checkpointer=memory.checkpointer())
        config = {"configurable": {"thread_id": memory.thread_key(run.thread)}, "callbacks": [recorder],
                  "recursion_limit": 10 * run.version.settings["limits"]["max_steps"] + 20}
        graph_input = _graph_input(built.graph, config, run, resume)
        if graph_input is not FINISHED:
            recorder.check()
            for _update in built.graph.stream(graph_input, config, stream_mode="updates"):
                pass
        state = built.graph.get_state(config)
        if state.interrupts:
            _pause(run, owner, list(state.interrupts[0].value.get("plan", [])), context.citations, elapsed())
            return
        answer = built.answer(state.values)
        if not answer:
            raise RunLimitReached("The agent ended without an answer (its last step was a tool call).")
        recorder.record(StepKind.ANSWER, "answer", {"text": answer})
        _finish(run, owner, RunStatus.DONE, answer=answer, citations=context.citations, elapsed_ms=elapsed())
    except Exception as exc:  # whatever it is, the run ends with its reason, never a run left running
        if isinstance(exc, RunCancelled) or recorder.cancellation.cancelled:  # a call cut short fails its own way
            message = "The run was cancelled."
            recorder.record(StepKind.ERROR, "cancelled", {"message": message}, ok=False)
            _finish(run, owner, RunStatus.CANCELLED, error=message, citations=context.citations,
                    elapsed_ms=elapsed())
            return
        _fail(run, owner, recorder, _failure(run, exc), elapsed(), context.citations)


def _failure(run: AgentRun, exc: Exception) -> str:
    if isinstance(exc, EXPECTED_FAILURES):
        return str(exc)
    if isinstance(exc, GraphRecursionError):
        return "The agent went round in circles past its step limit."
    if isinstance(exc, GatewayError):
        return f"A model call failed: {exc}"
    logger.exception("Agent run %s failed", run.public_id)
    return f"{type(exc).__name__}: {exc}"


def _fail(run: AgentRun, owner: str, recorder: Recorder, message: str, elapsed_ms: float,
          citations: list | None = None) -> None:
    recorder.record(StepKind.ERROR, "error", {"message": message}, ok=False)
    _finish(run, owner, RunStatus.FAILED, error=message, citations=citations, elapsed_ms=elapsed_ms)
