"""What Agent Studio's orchestration adds per step: a tool-calling run of STEPS model calls and tool calls on a
scripted model (no engine, so only the orchestration is timed), against the same model and tool calls made directly.

    .venv/bin/python -m bench.agent_overhead [--runs 30] [--steps 5] [--keep]

Two orchestrated figures: the LangGraph template alone (create_agent with its middleware and the SQLite
checkpointer), and a whole run as a worker makes it (claim, the graph, every step recorded in the database and
published to Redis, the lease renewed, the answer stored). Memory per run: the Python heap's peak during one run
(tracemalloc) and the process's RSS growth over all runs. Needs Redis (`make run` starts one; REDIS_URL). Runs on a
private instance (bench/helpers/private_instance.py: a temporary data dir and SQLite database).
"""

import argparse
import resource
import time
import tracemalloc
from collections import deque

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool

# First: it sets Django up on a private data dir, which the project's models need.
from bench.helpers.private_instance import bench_workspace, clean_up, print_header
from serving.metrics import percentile

# isort: split

from accounts.services import SYSTEM
from agent_studio import graphs, memory, runner, services
from agent_studio.models import AgentRun, AgentThread
from agent_studio.runs.fields import RunStatus
from agent_studio.strategies import GATEWAY_TAG
from agent_studio.toolkit import RunContext
from agent_studio.tracing import Recorder
from cluster import inventory
from cluster.services import register_node
from serving import presets
from serving.services import create_deployment, register_model

TARGET_ADDED_MS_PER_STEP = 5.0


class Scripted(BaseChatModel):
    """Replies from a shared script; no engine, so the benchmark times only what is around the model."""

    script: object

    @property
    def _llm_type(self) -> str:
        return "bench-scripted"

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.popleft())])


def _script(steps: int) -> deque:
    """The model's replies to a run: STEPS tool calls, the loop's last reply, then the respond step's answer."""
    calls = [AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"sku": f"A{n}"}, "id": f"c{n}",
                                                "type": "tool_call"}]) for n in range(steps)]
    return deque([*calls, AIMessage(content="Done."), AIMessage(content="All in stock.")])


def lookup(sku: str) -> str:
    return f"{sku}: 7 in stock"


TOOL = StructuredTool.from_function(func=lookup, name="lookup", description="Stock of a SKU.")


def _direct(steps: int) -> float:
    model = Scripted(script=_script(steps))
    started = time.perf_counter()
    messages = [HumanMessage(content="Check the stock.")]
    for _ in range(steps):
        reply = model.invoke(messages)
        messages.append(reply)
        messages.append(TOOL.invoke(reply.tool_calls[0]))
    messages.append(model.invoke(messages))
    messages.append(model.invoke(messages))
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    try:
        run(args.runs, args.steps)
    finally:
        clean_up(args.keep)


def run(runs: int, steps: int) -> None:
    print_header("Agent orchestration overhead", f"{runs} runs of {steps} model + tool steps on a scripted model")
    actor, workspace = bench_workspace()
    node = register_node(name="bench-node", resources=inventory.probe())
    locate, role, _template = presets.PRESETS[presets.SMOLLM2]
    model = register_model(actor=SYSTEM, workspace=None, name=presets.SMOLLM2, path=str(locate()), role_hint=role)
    create_deployment(actor=SYSTEM, workspace=None, model=model, name=presets.SMOLLM2, replicas=[(node, 1.0)])
    agent = services.save_agent(actor=actor, workspace=workspace, name="bench", template="tool_calling",
                                settings={"model": presets.SMOLLM2, "limits": {"max_steps": steps + 2,
                                                                                "max_tool_calls": steps + 1}})
    script = deque()
    graphs.gateway_model = lambda **kwargs: Scripted(script=script, tags=[GATEWAY_TAG])
    memory.checkpointer()

    def graph_only() -> float:
        thread = AgentThread.objects.create(agent=agent, end_user="bench")
        run = AgentRun.objects.create(workspace=workspace, agent=agent, version=agent.versions.first(), thread=thread,
                                      caller="bench", input="x", created_by=actor.user, lease_owner="bench")
        context = RunContext(actor=actor, workspace_id=workspace.pk, agent_id=agent.pk, agent_name=agent.name,
                             thread=thread, settings=agent.settings, recorder=Recorder(run, owner="bench"),
                             extra_tools=[TOOL])
        built = graphs.tool_calling(context, checkpointer=memory.checkpointer())
        script.extend(_script(steps))
        started = time.perf_counter()
        built.graph.invoke({"messages": [HumanMessage(content="Check the stock.")]},
                           {"configurable": {"thread_id": f"bench-{thread.public_id}"}, "recursion_limit": 100})
        return (time.perf_counter() - started) * 1000

    def whole_run() -> float:
        thread = AgentThread.objects.create(agent=agent, end_user="bench")
        run = AgentRun.objects.create(workspace=workspace, agent=agent, version=agent.versions.first(), thread=thread,
                                      caller="bench", input="Check the stock.", created_by=actor.user)
        script.extend(_script(steps))
        started = time.perf_counter()
        runner.execute(run.pk, owner="bench", extra_tools=[TOOL])
        elapsed = (time.perf_counter() - started) * 1000
        assert AgentRun.objects.get(pk=run.pk).status == RunStatus.DONE
        return elapsed

    for warm in (graph_only, whole_run):
        warm()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    direct, graph, whole = [], [], []
    for _ in range(runs):
        direct.append(_direct(steps))
        graph.append(graph_only())
        whole.append(whole_run())
    tracemalloc.start()
    whole_run()
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    print(f"{'path':<46}{'p50 ms':>10}{'p95 ms':>10}{'per step':>10}")
    for name, values in (("direct model and tool calls", direct), ("LangGraph template + checkpointer", graph),
                         ("whole run (recorded, published, leased)", whole)):
        p50 = percentile(values, 50)
        print(f"{name:<46}{p50:>10.1f}{percentile(values, 95):>10.1f}{p50 / steps:>10.2f}")
    added = (percentile(whole, 50) - percentile(direct, 50)) / steps
    graph_added = (percentile(graph, 50) - percentile(direct, 50)) / steps
    print(f"added per step: {graph_added:.2f} ms by the template, {added:.2f} ms by a whole run")
    print(f"memory: peak Python heap during one run {peak / 2**20:.1f} MiB; RSS grew "
          f"{(rss_after - rss_before) / 1024:.1f} MiB over {2 * runs} runs")
    print(f"target: <= {TARGET_ADDED_MS_PER_STEP:g} ms added per step (whole run): "
          f"{'met' if added <= TARGET_ADDED_MS_PER_STEP else 'NOT met'}")


if __name__ == "__main__":
    main()
