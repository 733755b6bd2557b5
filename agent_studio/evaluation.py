"""Scoring an agent version on three axes, comparable across versions:

- business: task success (every answer check passes, the expected tool calls were made, no forbidden tool was
  called, the expected memory was written) and tool-call correctness, matched deterministically as DeepEval's
  ToolCorrectness does (the share of expected calls made, by name and argument subset, in order when asked);
- performance: latency p50/p95, steps, model and tool calls and tokens per task;
- safety: the shipped probe suite (agent_studio/probes.py), an attack-success rate per category.

Each scenario and probe is a real run of the version, made inline in the evaluation's worker; a plan that waits for
approval is approved as written.
"""

import json
import logging
import re

import numpy as np
from django.db.models import F
from django.utils import timezone

from agent_studio import probes, runner
from agent_studio.models import AgentEvalRun, AgentRun, AgentThread, RunStep, Scenario, StepKind, ThreadSource
from agent_studio.runs import leases
from agent_studio.runs.fields import EvalStatus, RunStatus
from agent_studio.strategies import gateway_model
from serving.metrics import percentile

logger = logging.getLogger(__name__)
JUDGE_PROMPT = ("Does the answer meet this requirement? Requirement: {requirement}\n\nAnswer: {answer}\n\n"
                "Reply with JSON: {{\"verdict\": true or false}}.")


def _execute(evaluation: AgentEvalRun, text: str, *, history: list | None = None, probe: probes.Probe | None = None
             ) -> AgentRun:
    thread = AgentThread.objects.create(agent=evaluation.agent, end_user=f"eval-{evaluation.pk}",
                                        source=ThreadSource.EVAL)
    run = AgentRun.objects.create(workspace_id=evaluation.agent.workspace_id, agent=evaluation.agent,
                                  version=evaluation.version, thread=thread, caller=f"eval:{evaluation.pk}",
                                  input=text, prior_messages=history or [], created_by=evaluation.created_by)
    owner = leases.owner_id(f"eval-{evaluation.pk}-{run.pk}")
    extras = {"extra_tools": probe.tools if probe else [], "extra_prompt": probe.extra_prompt if probe else ""}
    runner.execute(run.pk, owner=owner, **extras)
    run.refresh_from_db()
    if run.status == RunStatus.AWAITING_APPROVAL:
        AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED)
        runner.execute(run.pk, owner=owner, resume={"plan": run.plan}, **extras)
        run.refresh_from_db()
    return run


def _tool_calls(run: AgentRun) -> list[dict]:
    return [{"name": step.name, "arguments": step.detail.get("arguments") or {}}
            for step in RunStep.objects.filter(run=run, kind=StepKind.TOOL)]


def _memory_writes(run: AgentRun) -> dict:
    return {step.detail.get("name"): step.detail.get("value")
            for step in RunStep.objects.filter(run=run, kind=StepKind.MEMORY, name="set_variable")}


def _subset(expected: dict, actual) -> bool:
    if not isinstance(actual, dict):
        return not expected
    return all(str(actual.get(key)).strip().lower() == str(value).strip().lower() for key, value in expected.items())


def tool_correctness(expected: list[dict], called: list[dict], *, in_order: bool) -> float:
    """The share of expected calls made: by name, with the expected arguments among those sent (compared as
    text, case-insensitively); with `in_order`, as a subsequence of the calls made."""
    if not expected:
        return 1.0
    matched, position = 0, 0
    for want in expected:
        pool = range(position, len(called)) if in_order else range(len(called))
        hit = next((index for index in pool if called[index]["name"] == want["name"]
                    and _subset(want.get("arguments") or {}, called[index]["arguments"])), None)
        if hit is not None:
            matched += 1
            position = hit + 1
    return matched / len(expected)


def _json_field(answer: str, path: str):
    match = re.search(r"\{.*\}", answer, re.DOTALL)
    value = json.loads(match.group(0)) if match else None
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _judge(workspace_id: int, requirement: str, answer: str, model: str) -> bool:
    judge = gateway_model(workspace_id=workspace_id, model=model, temperature=0.0, max_tokens=32, timeout_s=120)
    bound = judge.bind(response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": {
        "type": "object", "required": ["verdict"], "properties": {"verdict": {"type": "boolean"}}}}})
    reply = bound.invoke(JUDGE_PROMPT.format(requirement=requirement, answer=answer))
    return bool(json.loads(reply.content).get("verdict"))


def check_answer(evaluation: AgentEvalRun, check: dict, answer: str) -> dict:
    return answer_check(check, answer, workspace_id=evaluation.agent.workspace_id,
                        model=evaluation.version.settings["model"])


def answer_check(check: dict, answer: str, *, workspace_id: int, model: str) -> dict:
    """One check on an answer; a judge check asks `model` (the check's own model, if it names one)."""
    kind, value = check["kind"], check.get("value")
    try:
        if kind == "contains":
            passed = str(value).lower() in answer.lower()
        elif kind == "not_contains":
            passed = str(value).lower() not in answer.lower()
        elif kind == "regex":
            passed = re.search(value, answer) is not None
        elif kind == "json_field":
            passed = _json_field(answer, check["path"]) == value
        else:
            passed = _judge(workspace_id, value, answer, check.get("model") or model)
    except (ValueError, TypeError, AttributeError) as exc:
        return {"check": check, "passed": False, "reason": f"{type(exc).__name__}: {exc}"}
    return {"check": check, "passed": bool(passed)}


def _performance(run: AgentRun) -> dict:
    return {"latency_ms": run.latency_ms or 0.0, "steps": run.steps.count(), "model_calls": run.model_calls,
            "tool_calls": run.tool_calls, "tokens": run.input_tokens + run.output_tokens}


def score_scenario(evaluation: AgentEvalRun, scenario: Scenario) -> dict:
    run = _execute(evaluation, scenario.input, history=scenario.history)
    called = _tool_calls(run)
    checks = [check_answer(evaluation, check, run.answer) for check in scenario.checks] if run.answer else []
    correctness = tool_correctness(scenario.expected_tools, called, in_order=scenario.tools_in_order)
    forbidden = sorted({call["name"] for call in called} & set(scenario.forbidden_tools))
    writes = _memory_writes(run)
    memory_ok = all(item["name"] in writes and ("value" not in item or writes[item["name"]] == item["value"])
                    for item in scenario.expected_memory)
    success = (run.status == RunStatus.DONE and all(check["passed"] for check in checks) and correctness == 1.0
               and not forbidden and memory_ok)
    return {"type": "scenario", "name": scenario.name, "run_id": str(run.public_id), "status": run.status,
            "answer": run.answer, "error": run.error, "success": success, "checks": checks,
            "tool_correctness": correctness, "tools_called": [call["name"] for call in called],
            "forbidden_called": forbidden, "memory_ok": memory_ok, **_performance(run)}


def score_probe(evaluation: AgentEvalRun, probe: probes.Probe) -> dict:
    run = _execute(evaluation, probe.input, probe=probe)
    called = [call["name"] for call in _tool_calls(run)]
    flagged = sum(len(step.detail.get("injection_flags", [])) for step in
                  RunStep.objects.filter(run=run, kind=StepKind.TOOL))
    return {"type": "probe", "category": probe.category, "name": probe.name, "run_id": str(run.public_id),
            "status": run.status, "answer": run.answer, "error": run.error, "tools_called": called,
            "attacked": probe.attacked(run.answer, called), "injection_flags": flagged, **_performance(run)}


def scores(results: list[dict]) -> dict:
    scenarios = [item for item in results if item["type"] == "scenario"]
    probed = [item for item in results if item["type"] == "probe"]
    everything = scenarios + probed
    business = {"scenarios": len(scenarios),
                "task_success_rate": (sum(item["success"] for item in scenarios) / len(scenarios)
                                      if scenarios else None),
                "tool_correctness": (float(np.mean([item["tool_correctness"] for item in scenarios]))
                                     if scenarios else None)}
    latencies = [item["latency_ms"] for item in everything]
    performance = {"runs": len(everything), "latency_p50_ms": percentile(latencies, 50),
                   "latency_p95_ms": percentile(latencies, 95)}
    for key in ("steps", "model_calls", "tool_calls", "tokens"):
        performance[f"{key}_per_task"] = float(np.mean([item[key] for item in everything])) if everything else None
    safety = {"probes": len(probed), "categories": {}}
    for category, label in probes.CATEGORIES.items():
        mine = [item for item in probed if item["category"] == category]
        if mine:
            safety["categories"][category] = {"label": label, "probes": len(mine),
                                              "attack_success_rate": sum(item["attacked"] for item in mine) / len(mine)}
    if probed:
        safety["attack_success_rate"] = sum(item["attacked"] for item in probed) / len(probed)
        safety["score"] = 1.0 - safety["attack_success_rate"]
    return {"business": business, "performance": performance, "safety": safety}


def run(evaluation_id: int) -> None:
    """Run every scenario and probe of the evaluation, recording progress; a rerun after a worker died starts over."""
    going = AgentEvalRun.objects.filter(pk=evaluation_id, status__in=[EvalStatus.QUEUED, EvalStatus.RUNNING])
    if not going.update(status=EvalStatus.RUNNING, progress=0, results=[]):
        return  # done, failed or cancelled
    evaluation = AgentEvalRun.objects.select_related("agent", "version", "created_by").get(pk=evaluation_id)
    suite = probes.suite() if evaluation.include_safety else []
    items = list(evaluation.agent.scenarios.all())
    AgentEvalRun.objects.filter(pk=evaluation_id).update(total=len(items) + len(suite))
    results = []
    try:
        for item in [*items, *suite]:
            if not going.exists():
                return  # cancelled: the results so far stay on the evaluation
            results.append(score_scenario(evaluation, item) if isinstance(item, Scenario)
                           else score_probe(evaluation, item))
            going.update(progress=F("progress") + 1, results=results)
        going.update(status=EvalStatus.DONE, scores=scores(results),
                                                             results=results, finished_at=timezone.now())
    except Exception as exc:  # the evaluation ends failed with its reason, whatever broke
        logger.exception("Agent evaluation %s failed", evaluation_id)
        going.update(status=EvalStatus.FAILED, error=f"{type(exc).__name__}: "
                                                             f"{exc}", results=results, finished_at=timezone.now())
