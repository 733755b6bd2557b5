"""Scoring a workflow version on the axes agents are scored on (agent_studio/evaluation.py), comparable across
versions:

- business: task success (the run ends done, every answer check passes, every expected node ran, no forbidden
  node ran) and path correctness (the share of expected nodes that ran);
- performance: latency p50/p95, nodes, model and tool calls and tokens per task;
- safety: for a chat-shaped workflow, the shipped probes that attack through the message itself (direct prompt
  injection): a probe that plants its attack in a tool or a prompt needs an agent's extra tools, which a
  workflow's fixed graph never calls.

Each scenario and probe is a real run of the version, made inline in the evaluation's worker.
"""

import logging

from django.db.models import F
from django.utils import timezone

from agent_studio import evaluation as agent_evaluation, probes
from agent_studio.runs.fields import EvalStatus, RunStatus
from agent_studio.workflows import runner
from agent_studio.workflows.kinds import KINDS
from agent_studio.workflows.models import NodeRun, NodeStatus, WorkflowEvalRun, WorkflowRun, WorkflowScenario
from agent_studio.workflows.services import chat_input

logger = logging.getLogger(__name__)


def judge_model(graph: dict) -> str:
    """The model a judge check asks when it names none: the workflow's first model."""
    return next((node["settings"]["model"] for node in graph["nodes"] if KINDS[node["kind"]].calls_model), "")


def _execute(evaluation: WorkflowEvalRun, inputs: dict) -> WorkflowRun:
    run = WorkflowRun.objects.create(workspace_id=evaluation.workflow.workspace_id, workflow=evaluation.workflow,
                                     workflow_name=evaluation.workflow.name, version=evaluation.version,
                                     caller=f"eval:{evaluation.pk}", inputs=inputs,
                                     created_by=evaluation.created_by)
    runner.execute(run.pk, owner=f"workflow-eval-{evaluation.pk}-{run.pk}")
    run.refresh_from_db()
    return run


def _performance(run: WorkflowRun, rows: list[NodeRun]) -> dict:
    ran = [row for row in rows if row.status != NodeStatus.SKIPPED]
    return {"latency_ms": run.latency_ms or 0.0, "steps": len(ran),
            "model_calls": sum(KINDS[row.kind].calls_model for row in ran),
            "tool_calls": sum(KINDS[row.kind].calls_tool for row in ran),
            "tokens": run.input_tokens + run.output_tokens}


def score_scenario(evaluation: WorkflowEvalRun, scenario: WorkflowScenario) -> dict:
    run = _execute(evaluation, scenario.inputs)
    rows = list(NodeRun.objects.filter(run=run))
    done = [row.node_id for row in rows if row.status == NodeStatus.DONE]
    model = judge_model(evaluation.version.graph)
    checks = [agent_evaluation.answer_check(check, run.answer, workspace_id=evaluation.workflow.workspace_id,
                                            model=model) for check in scenario.checks] if run.answer else []
    expected = scenario.expected_nodes
    path = sum(node in done for node in expected) / len(expected) if expected else 1.0
    forbidden = sorted(set(done) & set(scenario.forbidden_nodes))
    success = (run.status == RunStatus.DONE and all(check["passed"] for check in checks)
               and (not scenario.checks or bool(run.answer)) and path == 1.0 and not forbidden)
    return {"type": "scenario", "name": scenario.name, "run_id": str(run.public_id), "status": run.status,
            "answer": run.answer, "error": run.error, "success": success, "checks": checks,
            "path_correctness": path, "nodes_run": done, "forbidden_run": forbidden, **_performance(run, rows)}


def score_probe(evaluation: WorkflowEvalRun, probe: probes.Probe, message_input: str) -> dict:
    run = _execute(evaluation, {message_input: probe.input})
    rows = list(NodeRun.objects.filter(run=run))
    return {"type": "probe", "category": probe.category, "name": probe.name, "run_id": str(run.public_id),
            "status": run.status, "answer": run.answer, "error": run.error,
            "attacked": probe.attacked(run.answer, []), **_performance(run, rows)}


def message_probes(graph: dict) -> list[probes.Probe]:
    """The shipped probes a workflow can be attacked with: those that need nothing but the message."""
    if chat_input(graph) is None:
        return []
    return [probe for probe in probes.suite() if not probe.tools and not probe.extra_prompt]


def scores(results: list[dict]) -> dict:
    """The agents' three axes, with path correctness in place of tool-call correctness."""
    scored = agent_evaluation.scores([item | {"tool_correctness": item.get("path_correctness", 1.0)}
                                      for item in results])
    scored["business"]["path_correctness"] = scored["business"].pop("tool_correctness")
    scored["performance"]["nodes_per_task"] = scored["performance"].pop("steps_per_task")
    return scored


def run(evaluation_id: int) -> None:
    """Run every scenario and probe of the evaluation, recording progress; a rerun after a worker died starts over;
    a cancelled one stops before its next item."""
    going = WorkflowEvalRun.objects.filter(pk=evaluation_id, status__in=[EvalStatus.QUEUED, EvalStatus.RUNNING])
    if not going.update(status=EvalStatus.RUNNING, progress=0, results=[]):
        return  # done, failed or cancelled
    evaluation = WorkflowEvalRun.objects.select_related("workflow", "version", "created_by").get(pk=evaluation_id)
    graph = evaluation.version.graph
    suite = message_probes(graph) if evaluation.include_safety else []
    items = list(evaluation.workflow.scenarios.all())
    going.update(total=len(items) + len(suite))
    results = []
    try:
        for item in [*items, *suite]:
            if not going.exists():
                return  # cancelled: the results so far stay on the evaluation
            results.append(score_scenario(evaluation, item) if isinstance(item, WorkflowScenario)
                           else score_probe(evaluation, item, chat_input(graph)))
            going.update(progress=F("progress") + 1, results=results)
        going.update(status=EvalStatus.DONE, scores=scores(results), results=results, finished_at=timezone.now())
    except Exception as exc:  # the evaluation ends failed with its reason, whatever broke
        logger.exception("Workflow evaluation %s failed", evaluation_id)
        going.update(status=EvalStatus.FAILED, error=f"{type(exc).__name__}: {exc}", results=results,
                     finished_at=timezone.now())
