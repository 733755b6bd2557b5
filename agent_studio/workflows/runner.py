"""Running one WorkflowRun in a Celery worker: claim it (a lease, as agent runs are claimed), compile its version's
graph to a LangGraph StateGraph, and run it node by node, each node recorded as a NodeRun row and published live.

Every node of the graph is a LangGraph node and every edge a LangGraph edge. A node runs once all the nodes before it
have settled (done or skipped) and at least one edge into it is live (its source ran and, from a branching node, the
branch taken is the edge's); when every edge into it is dead it is skipped, so a join after a condition runs once,
after whichever branch was taken.

A run whose worker died is claimed again when its lease runs out (agent_studio.workflows.tasks); the nodes it had
finished are not run again: their recorded outputs are taken from their rows.
"""

import logging
import queue
import threading
import time
from typing import Annotated, TypedDict

from django.db.models import Sum
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from accounts.cancellation import Cancellation
from accounts.services import Actor
from agent_studio import events, log_messages
from agent_studio.runs import cancel, leases
from agent_studio.runs.fields import RunStatus
from agent_studio.tracing import RunCancelled
from agent_studio.workflows import kinds, nodes
from agent_studio.workflows.checks import REFERENCE
from agent_studio.workflows.models import NodeRun, NodeStatus, WorkflowRun

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 3
CANCEL_CHECK_S = 0.5
DETAIL_CHARS = 4000


class NodeFailed(Exception):
    def __init__(self, node_id: str, reason: str):
        super().__init__(log_messages.NODE_FAILED(node=node_id, reason=reason))


def _merge(old: dict, new: dict) -> dict:
    return {**old, **new}


class State(TypedDict):
    outputs: Annotated[dict, _merge]  # node id -> its outputs
    settled: Annotated[dict, _merge]  # node id -> done | skipped


def run_payload(run: WorkflowRun) -> dict:
    return {"run_id": str(run.public_id), "status": run.status, "inputs": run.inputs, "answer": run.answer,
            "outputs": run.outputs, "error": run.error,
            "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
            "latency_ms": run.latency_ms}


def node_payload(row: NodeRun) -> dict:
    return {"index": row.index, "node": row.node_id, "kind": row.kind, "status": row.status, "inputs": row.inputs,
            "outputs": row.outputs, "error": row.error, "attempts": row.attempts, "latency_ms": row.latency_ms,
            "input_tokens": row.input_tokens, "output_tokens": row.output_tokens}


def _clip(value):
    text = nodes.as_text(value)
    return value if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "…"


class RunEvents:
    """A run's live events, published in order from a thread of their own, all those waiting in one round trip to
    Redis: a node does not wait on Redis (two round trips a node were most of the platform's cost per node). Leaving
    the `with` block publishes what is left, so the run's ending event comes after every node's."""

    def __init__(self, run_public_id):
        self.run_public_id = run_public_id
        self.waiting: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._drain, name=f"workflow-events-{run_public_id}", daemon=True)

    def __enter__(self) -> "RunEvents":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.waiting.put(None)
        self.thread.join()

    def publish(self, event: str, data: dict) -> None:
        self.waiting.put((event, data))

    def _drain(self) -> None:
        ended = False
        while not ended:
            batch = [self.waiting.get()]
            while not self.waiting.empty():
                batch.append(self.waiting.get())
            ended = None in batch
            try:
                events.publish_many(self.run_public_id, [item for item in batch if item is not None])
            except Exception:  # a viewer misses these events; the rows still hold every node's record
                logger.exception("Could not publish workflow run %s's events", self.run_public_id)


class Execution:
    """One attempt at a run: the graph's LangGraph nodes, and what they record."""

    def __init__(self, run: WorkflowRun, owner: str, live: RunEvents, cancellation: Cancellation):
        self.run, self.owner, self.live, self.cancellation = run, owner, live, cancellation
        self.graph = run.version.graph
        self.incoming: dict[str, list[dict]] = {node["id"]: [] for node in self.graph["nodes"]}
        for edge in self.graph["edges"]:
            self.incoming[edge["to"]].append(edge)
        self.streamed = answer_models(self.graph)
        self.recorded = {row.node_id: row for row in run.nodes.all()}
        self.index = max((row.index for row in self.recorded.values()), default=0)
        self.actor = Actor(user=run.created_by)
        self.cancel_checked = float("-inf")
        self.lock = threading.Lock()

    def check(self) -> None:
        """Between nodes: the cancel flag, read here too (at most every CANCEL_CHECK_S) so that a run cancelled
        before it started runs no node."""
        now = time.monotonic()
        if not self.cancellation.cancelled and now - self.cancel_checked >= CANCEL_CHECK_S:
            self.cancel_checked = now
            if WorkflowRun.objects.filter(pk=self.run.pk, cancel_requested=True).exists():
                self.cancellation.cancel()  # nodes running meanwhile on parallel branches stop too
        if self.cancellation.cancelled:
            raise RunCancelled(log_messages.RUN_CANCELLED())

    def _live(self, edge: dict, state: State) -> bool:
        source = edge["from"]
        if state["settled"].get(source) != NodeStatus.DONE:
            return False
        return "branch" not in edge or state["outputs"][source].get("output") == edge["branch"]

    def step(self, node: dict, state: State) -> dict:
        """What LangGraph's node for `node` does: run it once it can, skip it when no edge into it is live."""
        node_id = node["id"]
        if node_id in state["settled"]:
            return {}
        edges = self.incoming[node_id]
        if any(edge["from"] not in state["settled"] for edge in edges):
            return {}  # an edge into it is still to settle: a later trigger runs it
        if edges and not any(self._live(edge, state) for edge in edges):
            self._record_skip(node)
            return {"settled": {node_id: NodeStatus.SKIPPED}}
        done = self.recorded.get(node_id)
        if done is not None and done.status == NodeStatus.DONE:
            return {"outputs": {node_id: done.outputs}, "settled": {node_id: NodeStatus.DONE}}
        self.check()
        return {"outputs": {node_id: self._execute(node, state["outputs"])},
                "settled": {node_id: NodeStatus.DONE}}

    def _token_publisher(self, node_id: str):
        def publish(text: str) -> None:
            self.live.publish("token", {"node": node_id, "text": text})

        return publish

    def _record(self, node: dict, **fields) -> NodeRun:
        """The node's row, written once it has settled (one write per node); a row a failed attempt at the run
        left is replaced."""
        with self.lock:  # branches without a condition between them run in parallel, in LangGraph's threads
            self.index += 1
            row = NodeRun(run_id=self.run.pk, index=self.index, node_id=node["id"], kind=node["kind"],
                          finished_at=timezone.now(), **fields)
            if node["id"] in self.recorded:
                NodeRun.objects.filter(run_id=self.run.pk, node_id=node["id"]).delete()
            row.save(force_insert=True)
            self.recorded[node["id"]] = row
        self.live.publish("node", node_payload(row))
        return row

    def _record_skip(self, node: dict) -> None:
        self._record(node, status=NodeStatus.SKIPPED)

    def _execute(self, node: dict, values: dict) -> dict:
        self.live.publish("node", {"node": node["id"], "kind": node["kind"], "status": NodeStatus.RUNNING})
        policy = node["on_error"]
        tries = 1 + (policy.get("retries", 0) if policy["policy"] == "retry" else 0)
        started = time.perf_counter()
        context = nodes.Context(actor=self.actor, workspace_id=self.run.workspace_id,
                                caller=f"workflow:{self.run.workflow_name}"[:64], values=values, check=self.check,
                                on_token=self._token_publisher(node["id"]) if node["id"] in self.streamed else None)
        outputs, error = None, ""
        for attempt in range(tries):
            if attempt:
                self.cancellation.wait(policy["backoff_s"] * 2 ** (attempt - 1))
                self.check()
            context.shown = {}
            try:
                outputs = (dict(self.run.inputs) if node["kind"] == "start"
                           else kinds.KINDS[node["kind"]].run(context, node["settings"]))
                error = ""
                break
            except nodes.NodeError as exc:
                self.check()  # a node cut short by the run's cancel did not fail: the run was cancelled
                error = str(exc)
        status = NodeStatus.DONE
        if error and policy["policy"] == "default":
            outputs = {"output": policy.get("default")}
        elif error:
            status = NodeStatus.FAILED
        self._record(node, status=status, outputs=None if outputs is None else _clip_outputs(outputs),
                     error=error[:4000], inputs={key: _clip(value) for key, value in context.shown.items()},
                     attempts=attempt + 1, latency_ms=(time.perf_counter() - started) * 1000,
                     input_tokens=context.input_tokens or None, output_tokens=context.output_tokens or None)
        if status == NodeStatus.FAILED:
            raise NodeFailed(node["id"], error)
        return outputs


# Compiled graphs by the checksum of their graph (a version's never changes): compiling is a good part of a run's
# own cost, so a worker compiles each graph once. The nodes find the run's Execution in the config they get.
COMPILED_KEPT = 64
_compiled: dict[str, object] = {}


def _node(node: dict):
    def step(state: State, config: RunnableConfig) -> dict:
        return config["configurable"]["execution"].step(node, state)

    return step


def compiled(version) -> object:
    graph = _compiled.get(version.checksum)
    if graph is None:
        builder = StateGraph(State)
        for node in version.graph["nodes"]:
            builder.add_node(node["id"], _node(node))
        builder.add_edge(START, "start")
        for edge in version.graph["edges"]:
            builder.add_edge(edge["from"], edge["to"])
        sources = {edge["from"] for edge in version.graph["edges"]}
        for node in version.graph["nodes"]:
            if node["id"] not in sources:
                builder.add_edge(node["id"], END)
        if len(_compiled) >= COMPILED_KEPT:
            _compiled.pop(next(iter(_compiled)), None)
        graph = _compiled[version.checksum] = builder.compile()
    return graph


def answer_models(graph: dict) -> set[str]:
    """The LLM nodes whose text is an answer as it stands (an answer node of just `{{llm.output}}`, or of an
    aggregator of such outputs): their tokens are published as they stream, for a published app's callers."""
    by_id = {node["id"]: node for node in graph["nodes"]}

    def whole_output(text: str) -> str | None:
        found = REFERENCE.fullmatch(text.strip())
        return found[1] if found and found[2] == "output" and not found[3] else None

    def plain_llm(node_id) -> bool:
        node = by_id.get(node_id)
        return node is not None and node["kind"] == "llm" and not node["settings"].get("json_schema")

    streamed = set()
    for node in graph["nodes"]:
        source = whole_output(node["settings"]["answer"]) if node["kind"] == "answer" else None
        if source is None:
            continue
        if plain_llm(source):
            streamed.add(source)
        elif by_id[source]["kind"] == "aggregator":
            streamed |= {name.split(".")[0] for name in by_id[source]["settings"]["variables"]
                         if name.endswith(".output") and name.count(".") == 1 and plain_llm(name.split(".")[0])}
    return streamed


def _clip_outputs(outputs: dict) -> dict:
    """Outputs as they are passed on, unless one is too large to keep in a row: then the row keeps it cut."""
    return outputs if len(nodes.as_text(outputs)) <= 200_000 else {key: _clip(value) for key, value in outputs.items()}


def _finish(run: WorkflowRun, owner: str, status: str, *, answer: str = "", outputs: dict | None = None,
            error: str = "", elapsed_ms: float = 0.0) -> None:
    # The run's tokens are its nodes' (rows a failed attempt left were replaced): one sum here rather than an
    # update of the run after every model call.
    tokens = run.nodes.aggregate(input_tokens=Sum("input_tokens", default=0),
                                 output_tokens=Sum("output_tokens", default=0))
    fields = {"status": status, "answer": answer, "outputs": outputs or {}, "error": error[:4000],
              "finished_at": timezone.now(), "lease_until": None, "latency_ms": (run.latency_ms or 0.0) + elapsed_ms,
              **tokens}
    if not WorkflowRun.objects.filter(pk=run.pk, lease_owner=owner).update(**fields):
        return  # another worker took the run over; its outcome stands
    for name, value in fields.items():
        setattr(run, name, value)
    event = {RunStatus.DONE: "done", RunStatus.CANCELLED: "cancelled"}.get(status, "error")
    events.publish(run.public_id, event, run_payload(run))


def execute(run_pk: int, *, owner: str) -> None:
    run = leases.claim(WorkflowRun, run_pk, owner, related=("version", "created_by"))
    if run is None:
        return
    started = time.perf_counter()
    if run.attempts > MAX_ATTEMPTS:
        _finish(run, owner, RunStatus.FAILED,
                error=log_messages.RUN_INTERRUPTED(attempts=MAX_ATTEMPTS))
        return
    with leases.kept(WorkflowRun, run.pk, owner), cancel.watched(WorkflowRun, run.pk) as cancellation:
        _run(run, owner, started, cancellation)


def _run(run: WorkflowRun, owner: str, started: float, cancellation: Cancellation) -> None:
    def elapsed() -> float:
        return (time.perf_counter() - started) * 1000

    try:
        with RunEvents(run.public_id) as live:
            execution = Execution(run, owner, live, cancellation)
            execution.check()
            state = compiled(run.version).invoke(
                {"outputs": {}, "settled": {}},
                {"recursion_limit": 2 * len(run.version.graph["nodes"]) + 10,
                 "configurable": {"execution": execution}})
        answers = {node["id"]: state["outputs"][node["id"]] for node in run.version.graph["nodes"]
                   if node["kind"] == "answer" and state["settled"].get(node["id"]) == NodeStatus.DONE}
        if not answers:
            _finish(run, owner, RunStatus.FAILED, error=log_messages.NO_ANSWER_NODE(), elapsed_ms=elapsed())
            return
        _finish(run, owner, RunStatus.DONE, answer="\n\n".join(nodes.as_text(a["output"]) for a in answers.values()),
                outputs=answers, elapsed_ms=elapsed())
    except RunCancelled as exc:
        _finish(run, owner, RunStatus.CANCELLED, error=str(exc), elapsed_ms=elapsed())
    except NodeFailed as exc:
        _finish(run, owner, RunStatus.FAILED, error=str(exc), elapsed_ms=elapsed())
    except Exception as exc:  # anything else still ends the run with its reason, never a run left running
        if cancellation.cancelled:  # what a cancel cut short may fail in its own way
            _finish(run, owner, RunStatus.CANCELLED, error=log_messages.RUN_CANCELLED(), elapsed_ms=elapsed())
            return
        logger.exception("Workflow run %s failed", run.public_id)
        _finish(run, owner, RunStatus.FAILED, error=f"{type(exc).__name__}: {exc}", elapsed_ms=elapsed())
