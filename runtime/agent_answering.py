"""One call of a published agent app: the release's agent version runs on the conversation's thread in a worker,
its steps reach the caller as they happen, and the call's trace is stored when the run ends or pauses on its plan
(then updated when the approved plan has run).

The conversation is the agent's thread (they share an id), so the agent's own short-term memory carries the turns;
the OpenAI-compatible endpoint, which sends the conversation with every call, starts a new thread with those turns.
"""

import time
import uuid
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async

from accounts.errors import NotFound
from agent_studio import events, services as agent_services, streaming
from agent_studio.models import AgentRun, ThreadSource
from agent_studio.runs.fields import RunStatus
from runtime.answering import Call
from runtime.models import Trace, TraceStatus
from serving.models import Deployment

# How long past the agent's own time limit a caller waits for its run before giving up on it.
WAIT_MARGIN_S = 60
TRACE_STATUS = {RunStatus.DONE: TraceStatus.OK, RunStatus.AWAITING_APPROVAL: TraceStatus.AWAITING,
                RunStatus.CANCELLED: TraceStatus.CANCELLED}


class RunTimedOut(Exception):
    pass


def start(call: Call) -> AgentRun:
    access = call.access
    agent, release = access.app.agent, access.release
    thread_id, prior = None, []
    if call.conversation is not None:
        thread_id = agent_services.conversation_thread(agent=agent, public_id=call.conversation.public_id,
                                                       end_user=call.end_user).public_id
    else:
        prior = call.history
    return agent_services.start_run(actor=None, agent=agent, input=call.query, thread_id=thread_id,
                                    end_user=call.end_user, source=ThreadSource.APP, version=release.agent_version,
                                    caller=f"app:{access.app.slug}", prior_messages=prior,
                                    run_as=release.published_by)


def app_run(*, app, public_id) -> AgentRun:
    """One of this app's runs by its id; another app's (or none) is unknown."""
    run = AgentRun.objects.select_related("agent", "version", "thread").filter(
        public_id=public_id if _uuid(public_id) else None, agent_id=app.agent_id, caller=f"app:{app.slug}").first()
    if run is None:
        raise NotFound(f"No run '{public_id}' in the app '{app.slug}'.")
    return run


def _uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def approve(*, app, public_id, plan) -> tuple[AgentRun, str]:
    """Resume a paused run with the plan as the caller edited it; the stream position to follow it from."""
    run = app_run(app=app, public_id=public_id)
    after = events.last_id(run.public_id)
    agent_services.approve_plan(actor=None, run=run, plan=plan)
    return app_run(app=app, public_id=public_id), after


def resumed_call(*, access, run: AgentRun, stream) -> Call:
    """The call that paused on the plan, carried on: its trace gets the outcome."""
    trace = Trace.objects.select_related("conversation").filter(agent_run=run).first()
    if trace is None:
        raise NotFound(f"No call of '{access.app.slug}' started run {run.public_id}.")
    return Call(access=access, channel=trace.channel, query=trace.query, stream=stream is True,
                end_user=trace.end_user, conversation=trace.conversation, message_id=trace.public_id)


async def follow(run: AgentRun, *, after: str = "0") -> AsyncIterator[tuple[str, dict]]:
    """The run's events, ending with done, error, cancelled or plan; RunTimedOut when the run outlasts its limit."""
    deadline = time.monotonic() + run.version.settings["limits"]["timeout_s"] + WAIT_MARGIN_S
    async for _stream_id, event, data in streaming.run_events(run, after=after):
        if event == "ping":
            if time.monotonic() > deadline:
                raise RunTimedOut(f"The run {run.public_id} did not finish within its time limit.")
            continue
        yield event, data


async def outcome(run: AgentRun, *, after: str = "0") -> tuple[str, dict]:
    async for event, data in follow(run, after=after):
        if event in events.ENDING:
            return event, data
    raise RunTimedOut(f"The run {run.public_id} ended without an outcome.")


def save_trace(call: Call, run: AgentRun) -> Trace:
    """The call's trace, from the run as it stands (created on the first answer or pause, updated after)."""
    run.refresh_from_db()
    model = run.version.settings["model"]
    fields = {"app": call.access.app, "release": call.access.release, "conversation": call.conversation,
              "app_key": call.access.app_key, "channel": call.channel, "end_user": call.end_user,
              "stream": call.stream, "query": call.query, "answer": run.answer, "citations": run.citations,
              "deployment": model,
              "model": Deployment.objects.filter(name=model).values_list("model__name", flat=True).first() or "",
              "input_tokens": run.input_tokens, "output_tokens": run.output_tokens,
              "latency_ms": round((time.perf_counter() - call.started) * 1000, 2),
              "status": TRACE_STATUS.get(run.status, TraceStatus.ERROR), "error": run.error[:4000], "agent_run": run}
    trace, _ = Trace.objects.update_or_create(public_id=call.message_id, defaults=fields)
    return trace


async def store(call: Call, run: AgentRun) -> None:
    await sync_to_async(save_trace, thread_sensitive=False)(call, run)
