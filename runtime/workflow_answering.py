"""One call of a published workflow app: the release's workflow version runs in a worker on the caller's inputs
(a chat message fills the workflow's `query`/`question`/`message` input), each node's start and record and the
answer's tokens reach the caller as they happen, and the call's trace, pointing at the run and so at its per-node
records, is stored when the run ends.

A workflow keeps no memory of its own: a conversation's earlier turns reach it through an optional `history`
input, when it declares one.
"""

import json
import time
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils.translation import gettext as _

from accounts.errors import ValidationFailed
from agent_studio import events
from agent_studio.runs.fields import RunStatus
from agent_studio.workflows import services as workflow_services, streaming
from agent_studio.workflows.models import WorkflowRun
from agent_studio.workflows.nodes import as_text
from runtime import answering
from runtime.access import Access
from runtime.models import Trace, TraceStatus

SUMMARY_CHARS = 300
TRACE_STATUS = {RunStatus.DONE: TraceStatus.OK, RunStatus.CANCELLED: TraceStatus.CANCELLED}


class RunTimedOut(Exception):
    pass


def not_chat_shaped(access: Access) -> ValidationFailed:
    graph = access.release.workflow_version.graph
    inputs = ", ".join(f"{item['name']} ({item['type']}{', required' if item['required'] else ''})"
                       for item in graph["inputs"]) or "none"
    return ValidationFailed(
        _("'%(app)s' serves the workflow '%(workflow)s', which is not chat-shaped: a chat message fills a text input "
          "named %(names)s, and every other input must be optional. Its inputs: %(inputs)s. Call "
          "/api/apps/%(app)s/chat with \"inputs\" instead.")
        % {"app": access.app.slug, "workflow": access.app.workflow.name,
           "names": ", ".join(workflow_services.CHAT_INPUTS), "inputs": inputs},
        fields={"query": ["The workflow has no chat input."]})


def prepare(*, access: Access, channel: str, body: dict, query=None, history=None) -> tuple[answering.Call, dict]:
    """The call and the run's inputs: `inputs` from the body, the message (`query`, or an OpenAI conversation's
    last user message) in the chat input, the conversation so far in `history` when the workflow has it. Checked
    before anything is stored."""
    graph = access.release.workflow_version.graph
    inputs = body.get("inputs", {})
    if not isinstance(inputs, dict):
        raise ValidationFailed("'inputs' must be an object of name: value.", fields={"inputs": ["Not an object."]})
    inputs = dict(inputs)
    if query is not None:
        name = workflow_services.chat_input(graph)
        if name is None:
            raise not_chat_shaped(access)
        inputs[name] = answering.clean_query(query)
    declared = {item["name"] for item in graph["inputs"]}
    wants_history = workflow_services.HISTORY_INPUT in declared and workflow_services.HISTORY_INPUT not in inputs
    workflow_services.clean_inputs(graph, inputs)
    summary = inputs[name] if query is not None else json.dumps(inputs, ensure_ascii=False)
    call = answering.prepare(access=access, channel=channel, query=summary[:answering.MAX_QUERY_CHARS] or "{}",
                             stream=body.get("stream", False), user=body.get("user"),
                             conversation_id=body.get("conversation_id"), history=history)
    if wants_history:
        inputs[workflow_services.HISTORY_INPUT] = call.history
    return call, inputs


def start(call: answering.Call, inputs: dict) -> WorkflowRun:
    access = call.access
    return workflow_services.start_run(actor=None, workflow=access.app.workflow, inputs=inputs,
                                       version=access.release.workflow_version, caller=f"app:{access.app.slug}",
                                       run_as=access.release.published_by)


def _summary(outputs) -> str | None:
    if outputs is None:
        return None
    text = as_text(outputs.get("output") if isinstance(outputs, dict) and "output" in outputs else outputs)
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS] + "…"


def node_event(data: dict) -> tuple[str, dict]:
    """A run's `node` event as the app's callers see it: node_started, or node_finished with its status, timing
    and a summary of its output."""
    if data.get("status") == "running":
        return "node_started", {"node": data["node"], "kind": data["kind"]}
    return "node_finished", {"node": data["node"], "kind": data["kind"], "status": data["status"],
                             "latency_ms": data.get("latency_ms"), "output": _summary(data.get("outputs")),
                             "error": data.get("error") or ""}


async def follow(run: WorkflowRun, *, after: str = "0") -> AsyncIterator[tuple[str, dict]]:
    """The run's events, ending with done, error or cancelled; RunTimedOut when it outlasts WORKFLOW_APP_WAIT_S."""
    deadline = time.monotonic() + settings.WORKFLOW_APP_WAIT_S
    async for _stream_id, event, data in streaming.run_events(run, after=after):
        if event == "ping":
            if time.monotonic() > deadline:
                raise RunTimedOut(f"The workflow run {run.public_id} did not finish within "
                                  f"{settings.WORKFLOW_APP_WAIT_S:.0f} s.")
            continue
        yield event, data


async def outcome(run: WorkflowRun) -> tuple[str, dict]:
    async for event, data in follow(run):
        if event in events.ENDING:
            return event, data
    raise RunTimedOut(f"The workflow run {run.public_id} ended without an outcome.")


def save_trace(call: answering.Call, run: WorkflowRun) -> Trace:
    run.refresh_from_db()
    models = sorted({node["settings"]["model"] for node in run.version.graph["nodes"]
                     if "model" in node.get("settings", {})}) if run.version else []
    fields = {"app": call.access.app, "release": call.access.release, "conversation": call.conversation,
              "app_key": call.access.app_key, "channel": call.channel, "end_user": call.end_user,
              "stream": call.stream, "query": call.query, "answer": run.answer, "deployment": ", ".join(models)[:96],
              "input_tokens": run.input_tokens, "output_tokens": run.output_tokens,
              "latency_ms": round((time.perf_counter() - call.started) * 1000, 2),
              "status": TRACE_STATUS.get(run.status, TraceStatus.ERROR), "error": run.error[:4000],
              "workflow_run": run}
    trace, _ = Trace.objects.update_or_create(public_id=call.message_id, defaults=fields)
    return trace


async def store(call: answering.Call, run: WorkflowRun) -> None:
    await sync_to_async(save_trace, thread_sensitive=False)(call, run)
