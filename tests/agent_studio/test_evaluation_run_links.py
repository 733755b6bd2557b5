"""Issue 48: an agent evaluation's report links each case to the run that produced it, whose page shows what the
run did step by step (why a failed case failed), and leads back to the report; another workspace's run is a 404."""

import uuid

import pytest
from django.test import Client

from agent_studio import services
from agent_studio.models import AgentEvalRun, AgentRun, RunStep, StepKind
from agent_studio.runs.fields import EvalStatus, RunStatus
from tests.agent_studio.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)


def _result(name: str, run: AgentRun | None, success: bool) -> dict:
    return {"type": "scenario", "name": name, "run_id": str(run.public_id if run else uuid.uuid4()),
            "status": "done", "answer": "3", "error": "", "success": success, "checks": [], "tool_correctness": 1.0,
            "tools_called": [], "forbidden_called": [], "memory_ok": True, "latency_ms": 5.0, "steps": 1,
            "model_calls": 1, "tool_calls": 0, "tokens": 3}


def test_a_failed_case_links_to_its_runs_steps(acme, ann, make_workspace):
    agent = services.save_agent(actor=ann, workspace=acme, name="counter", template="tool_calling",
                                settings={"model": MODEL})
    failed = services.start_run(actor=ann, agent=agent, input="Count 'a b c'.")
    AgentRun.objects.filter(pk=failed.pk).update(status=RunStatus.DONE, answer="Two words.")
    RunStep.objects.create(run=failed, index=0, kind=StepKind.TOOL, name="word_count", detail={"result": 3})
    passed = services.start_run(actor=ann, agent=agent, input="Count 'a b'.")
    evaluation = AgentEvalRun.objects.create(agent=agent, version=agent.versions.first(), status=EvalStatus.DONE,
                                             total=3, results=[_result("three words", failed, False),
                                                               _result("two words", passed, True),
                                                               _result("run deleted since", None, False)])
    client = Client()
    client.login(username="ann", password="correct-horse-battery")

    report = client.get(f"/agents/evaluations/{evaluation.pk}/").content.decode()

    row = report[report.index('data-result="three words"'):]
    link = f'href="/agents/runs/{failed.public_id}/?evaluation={evaluation.pk}"'
    assert link in row[:row.index("</tr>")] and "why: its run's steps" in row[:row.index("</tr>")]
    gone = report[report.index('data-result="run deleted since"'):]
    assert 'data-field="trace"' not in gone[:gone.index("</tr>")]
    page = client.get(f"/agents/runs/{failed.public_id}/?evaluation={evaluation.pk}").content.decode()
    assert "Count &#x27;a b c&#x27;." in page and "Two words." in page and 'data-kind="tool"' in page
    assert f'href="/agents/evaluations/{evaluation.pk}/"' in page
    chinese = client.get(f"/agents/runs/{failed.public_id}/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "counter 的运行" in chinese and "步骤" in chinese

    make_workspace("Globex", owner="bob")
    stranger = Client()
    stranger.login(username="bob", password="correct-horse-battery")
    assert stranger.get(f"/agents/runs/{failed.public_id}/").status_code == 404
