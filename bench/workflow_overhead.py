"""What a workflow run costs the platform beyond its nodes' own work: a chain of NODES nodes (start, then llm → tool
→ template repeated, then answer) on a scripted model and a no-op Work Bridge tool (python, in the sandbox), run as a
worker runs it (claim, the LangGraph graph, every node's variables resolved, its row written, its events published
to Redis, the lease renewed, the answer stored).

    .venv/bin/python -m bench.workflow_overhead [--runs 20] [--nodes 20] [--keep]

A node's own work is the scripted model's call and the tool's invocation (sandbox and invocation row); everything
else is the platform's. Per node: the node's step minus its own work (p50 over every node of every run). Per run:
the whole run minus all its nodes' own work. Needs Redis (REDIS_URL). Runs on a private instance
(bench/helpers/private_instance.py).
"""

import argparse
import time

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult

# First: it sets Django up on a private data dir, which the project's models need.
from bench.helpers.private_instance import bench_workspace, clean_up, print_header
from serving.metrics import percentile

# isort: split

from accounts.services import SYSTEM
from agent_studio.runs.fields import RunStatus
from agent_studio.workflows import nodes, runner, services as workflow_services
from agent_studio.workflows.models import WorkflowRun
from cluster import inventory
from cluster.services import register_node
from serving import presets
from serving.services import create_deployment, register_model
from workbridge import services as workbridge_services

TARGET_PER_NODE_MS = 5.0
TARGET_PER_RUN_MS = 100.0


class OwnWork:
    """The time spent in the nodes' own work (model and tool calls), added up."""

    def __init__(self):
        self.ms = 0.0

    def timed(self, function):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.ms += (time.perf_counter() - started) * 1000

        return call


class Scripted(BaseChatModel):
    @property
    def _llm_type(self) -> str:
        return "bench-scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])


def _graph(node_count: int, tool_id: int) -> dict:
    middle = []
    for n in range(node_count - 2):
        kind = ("llm", "tool", "template")[n % 3]
        previous = middle[-1]["id"] if middle else "start"
        settings = {"llm": {"model": presets.SMOLLM2, "prompt": f"Say ok to {{{{start.question}}}} ({n})"},
                    "tool": {"tool": tool_id, "arguments": {"text": f"{{{{{previous}.output}}}}" if middle else
                                                            "{{start.question}}"}},
                    "template": {"template": f"{{{{ {previous}.output }}}} and {{{{ start.question }}}}"}}[kind]
        middle.append({"id": f"n{n}", "kind": kind, "settings": settings})
    ids = ["start", *[node["id"] for node in middle], "reply"]
    return {"inputs": [{"name": "question", "type": "string"}],
            "nodes": [{"id": "start", "kind": "start"}, *middle,
                      {"id": "reply", "kind": "answer", "settings": {"answer": f"{{{{{ids[-2]}.output}}}}"}}],
            "edges": [{"from": a, "to": b} for a, b in zip(ids, ids[1:])]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    try:
        run(args.runs, args.nodes)
    finally:
        clean_up(args.keep)


def run(runs: int, node_count: int) -> None:
    print_header("Workflow overhead", f"{runs} runs of a {node_count}-node chain on a scripted model and a no-op tool")
    actor, workspace = bench_workspace()
    node = register_node(name="bench-node", resources=inventory.probe())
    locate, role, _template = presets.PRESETS[presets.SMOLLM2]
    model = register_model(actor=SYSTEM, workspace=None, name=presets.SMOLLM2, path=str(locate()), role_hint=role)
    create_deployment(actor=SYSTEM, workspace=None, model=model, name=presets.SMOLLM2, replicas=[(node, 1.0)])
    tool = workbridge_services.save_tool(actor=actor, workspace=workspace, name="noop", description="Does nothing.",
                                         binding="python", parameters={"type": "object"},
                                         config={"code": "def run(args):\n    return 'ok'\n"})
    workflow = workflow_services.save_workflow(actor=actor, workspace=workspace, name="bench",
                                               graph=_graph(node_count, tool.pk))
    own = OwnWork()
    nodes.gateway_model = lambda **kwargs: Scripted()
    Scripted.invoke = own.timed(Scripted.invoke)
    nodes.invoke_tool = own.timed(nodes.invoke_tool)
    per_node: list[float] = []
    original_step = runner.Execution.step

    def timed_step(self, graph_node, state):
        own_before, started = own.ms, time.perf_counter()
        result = original_step(self, graph_node, state)
        per_node.append((time.perf_counter() - started) * 1000 - (own.ms - own_before))
        return result

    runner.Execution.step = timed_step

    def one_run() -> tuple[float, float]:
        queued = WorkflowRun.objects.create(workspace=workspace, workflow=workflow, workflow_name=workflow.name,
                                            version=workflow.versions.first(), caller="bench",
                                            inputs={"question": "hi"}, created_by=actor.user)
        own_before, started = own.ms, time.perf_counter()
        runner.execute(queued.pk, owner="bench")
        elapsed = (time.perf_counter() - started) * 1000
        finished = WorkflowRun.objects.get(pk=queued.pk)
        assert finished.status == RunStatus.DONE, finished.error
        return elapsed, own.ms - own_before

    one_run()
    per_node.clear()
    totals, overheads = [], []
    for _ in range(runs):
        elapsed, work = one_run()
        totals.append(elapsed)
        overheads.append(elapsed - work)
    node_p50 = percentile(per_node, 50)
    run_p50 = percentile(overheads, 50)
    print(f"{'figure':<52}{'p50 ms':>10}{'p95 ms':>10}")
    print(f"{'whole run':<52}{percentile(totals, 50):>10.1f}{percentile(totals, 95):>10.1f}")
    print(f"{'run overhead (whole run - nodes own work)':<52}{run_p50:>10.1f}{percentile(overheads, 95):>10.1f}")
    print(f"{'per node overhead (step - own work)':<52}{node_p50:>10.2f}{percentile(per_node, 95):>10.2f}")
    node_verdict = "met" if node_p50 <= TARGET_PER_NODE_MS else "NOT met"
    run_verdict = "met" if run_p50 <= TARGET_PER_RUN_MS else "NOT met"
    print(f"target: <= {TARGET_PER_NODE_MS:g} ms per node p50: {node_verdict}; <= {TARGET_PER_RUN_MS:g} ms per "
          f"{node_count}-node run: {run_verdict}")


if __name__ == "__main__":
    main()
