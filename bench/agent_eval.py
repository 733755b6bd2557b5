"""The demo agent's evaluation on SmolLM2-135M: its scenarios and the shipped safety probe suite, run for real through
the gateway of a running instance, and the three scores printed as tables.

    .venv/bin/python -m bench.agent_eval [--model smollm2-135m-instruct] [--strategy native]

Run against a running instance (`make run`): the demo agent is made (or remade) in the admin's first workspace, the
instance's worker runs the evaluation (each scenario and probe a real run), and it is kept for the GUI (Agent Studio →
word-counter → Evaluation).
"""

import argparse
import time

# First: it reads the instance's settings and sets Django up, which the project's models need.
from bench.helpers.running_instance import ADMIN_USERNAME, PRESET_MODEL, print_header

# isort: split

from django.contrib.auth import get_user_model

from accounts.models import Workspace
from accounts.services import Actor
from agent_studio import demo, probes, services
from agent_studio.models import AgentEvalRun


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=PRESET_MODEL)
    parser.add_argument("--strategy", default="native", choices=["native", "json", "react_text"])
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    admin = get_user_model().objects.get(username=ADMIN_USERNAME)
    actor = Actor(user=admin)
    workspace = Workspace.objects.filter(memberships__user=admin).order_by("pk").first()
    agent = demo.create_demo_agent(actor=actor, workspace=workspace, model=args.model)
    if agent.settings["tool_strategy"] != args.strategy:
        agent = services.save_agent(actor=actor, workspace=workspace, agent=agent, name=agent.name,
                                    template=agent.template, description=agent.description,
                                    settings={**agent.settings, "tool_strategy": args.strategy})
    print_header(f"Agent evaluation: {agent.name} v{agent.version} on {args.model}, strategy {args.strategy}",
                 f"{agent.scenarios.count()} scenarios and {len(probes.suite())} safety probes, run by the worker")
    started = time.perf_counter()
    pending = services.start_evaluation(actor=actor, agent=agent)
    while (done := AgentEvalRun.objects.get(pk=pending.pk)).status in ("queued", "running"):
        if time.perf_counter() - started > args.timeout:
            raise SystemExit(f"The evaluation did not finish in {args.timeout} s ({done.progress}/{done.total}).")
        time.sleep(2)
    print(f"{len(done.results)} runs in {time.perf_counter() - started:.0f} s; status {done.status} {done.error}")
    business, performance, safety = (done.scores.get(key, {}) for key in ("business", "performance", "safety"))
    print("\nbusiness")
    print(f"  task success rate {business.get('task_success_rate')}, tool correctness "
          f"{business.get('tool_correctness')} over {business.get('scenarios')} scenarios")
    for item in done.results:
        if item["type"] == "scenario":
            print(f"  {'ok  ' if item['success'] else 'FAIL'} {item['name']:<28} tools {item['tools_called']} "
                  f"answer {item['answer'][:70]!r}")
    print("\nperformance")
    figure = {name: performance.get(name, 0) for name in (
        "latency_p50_ms", "latency_p95_ms", "steps_per_task", "model_calls_per_task", "tool_calls_per_task",
        "tokens_per_task")}
    print(f"  latency p50 {figure['latency_p50_ms']:.0f} ms, p95 {figure['latency_p95_ms']:.0f} ms; per task: "
          f"{figure['steps_per_task']:.1f} steps, {figure['model_calls_per_task']:.1f} model calls, "
          f"{figure['tool_calls_per_task']:.1f} tool calls, {figure['tokens_per_task']:.0f} tokens")
    print("\nsafety (attack success rate per category; lower is better)")
    for category, label in probes.CATEGORIES.items():
        row = safety.get("categories", {}).get(category)
        if row:
            print(f"  {label:<48} {row['attack_success_rate']:.2f} ({row['probes']} probe(s))")
    print(f"  overall attack success rate {safety.get('attack_success_rate')}, safety score {safety.get('score')}")
    print(f"\nThe report: Agent Studio → {agent.name} → Evaluation → #{done.pk}")


if __name__ == "__main__":
    main()
