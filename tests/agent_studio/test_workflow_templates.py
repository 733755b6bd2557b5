"""The workflow templates shipped with the platform: listed, made into workflows with the assets a user binds (a
clear 400 naming what is missing), and each one's scenario set scored by the evaluation on the three axes, with
the scripted model answering as a model would and everything else real (the sandbox's code and tools, the
knowledge base, the runner). Evaluations are queued and cancellable like agents'."""

import json
import re

import pytest

from agent_studio.runs.fields import EvalStatus
from agent_studio.workflows import evaluation, nodes
from agent_studio.workflows.models import WorkflowEvalRun, WorkflowScenario
from tests.agent_studio.conftest import MODEL, Script, ScriptedModel
from tests.rag_studio.conftest import presets  # noqa: F401  (the preset models, registered)
from workbridge.models import Tool

pytestmark = pytest.mark.django_db(transaction=True)
TEMPLATES = "/api/workflows/templates/"


@pytest.fixture
def model_replies(monkeypatch):
    """The scripted model, answering each prompt the way a capable model would."""
    def reply(messages) -> str:
        system = next((m.content for m in messages if m.type == "system"), "")
        text = messages[-1].content
        order = re.search(r"A\d{4}", text)
        if "Classify the text" in system:
            kind = "order" if order else "policy" if "return" in text.lower() else "other"
            return json.dumps({"class": kind})
        if text.startswith("Write the order id"):
            return json.dumps({"order_id": order.group(0) if order else ""})
        if text.startswith("Order record:"):
            status = re.search(r'"status": "([a-z ]+)"', text).group(1)
            return f"Your order is {status}."
        if "Handbook passages" in text:
            return "Returns are accepted within 30 days of delivery; a colleague will look at your case."
        if "Contract:" in text:
            if "EUR 12,500" in text:
                return json.dumps({"party": "Northwind GmbH", "amount": 12500, "currency": "EUR",
                                   "start_date": "2025-03-01"})
            return json.dumps({"party": "Contoso", "amount": 0, "currency": "", "start_date": ""})
        if "简体中文" in system:
            return "退货期限为三十天。"
        return "You have 30 days to return an item."

    class Unending(Script):
        """Every call gets `reply`, however many calls the evaluation makes."""

        def popleft(self):
            return reply

        def __bool__(self):
            return True

    script = Unending()
    monkeypatch.setattr(nodes, "gateway_model", lambda **kwargs: ScriptedModel(
        script=script, prompts=script.prompts, offered=script.offered))
    return script


@pytest.fixture
def faq_kb(acme, ann, presets):  # noqa: F811
    from rag_studio import services as rag_services

    return rag_services.create_knowledge_base(actor=ann, workspace=acme, name="FAQ")


def _create(dev, template: str, **bindings):
    return dev.post(TEMPLATES, {"template": template, "bindings": bindings}, format="json")


def _evaluate(dev, workflow_id: int) -> WorkflowEvalRun:
    started = dev.post(f"/api/workflows/{workflow_id}/evaluations/", {}, format="json")
    assert started.status_code == 202, started.json()
    evaluation.run(started.json()["id"])  # what the interactive worker does with it
    report = dev.get(f"/api/workflows/evaluations/{started.json()['id']}/").json()
    assert report["status"] == EvalStatus.DONE, report
    return report


def test_the_templates_are_listed_with_what_they_need(dev):
    listed = {template["key"]: template for template in dev.get(TEMPLATES).json()}

    assert set(listed) == {"support-triage", "document-review", "bilingual-faq"}
    slots = {binding["slot"]: binding["required"] for binding in listed["support-triage"]["bindings"]}
    assert slots == {"model": True, "knowledge_base": True, "order_tool": False}
    assert all(template["scenarios"] for template in listed.values())


def test_a_template_names_every_missing_or_wrong_binding(dev, faq_kb):
    missing = _create(dev, "support-triage")
    assert missing.status_code == 400
    message = missing.json()["error"]["message"]
    assert "model: a chat deployment or model group" in message and "knowledge_base: a knowledge base" in message
    assert "order_tool" not in message
    wrong = _create(dev, "support-triage", model="no-such-model", knowledge_base=faq_kb.pk)
    assert wrong.status_code == 400 and "No deployment named 'no-such-model'" in wrong.json()["error"]["message"]
    gone = _create(dev, "bilingual-faq", model=MODEL, knowledge_base=999999)
    assert "there is no knowledge base 999999" in gone.json()["error"]["message"]
    unknown = _create(dev, "tax-return", model=MODEL)
    assert unknown.status_code == 400 and "one of bilingual-faq, document-review" in unknown.json()["error"]["message"]
    assert not WorkflowScenario.objects.exists() and not Tool.objects.exists()


def test_support_triage_creates_its_order_tool_and_scores_its_scenarios(dev, faq_kb, model_replies):
    created = _create(dev, "support-triage", model=MODEL, knowledge_base=faq_kb.pk)
    assert created.status_code == 201, created.json()
    assert created.json()["scenarios"] == 4
    tool = Tool.objects.get(name="order_lookup")
    lookup = next(node for node in created.json()["graph"]["nodes"] if node["id"] == "lookup")
    assert lookup["settings"]["tool"] == tool.pk

    report = _evaluate(dev, created.json()["id"])

    scenarios = {item["name"]: item for item in report["results"] if item["type"] == "scenario"}
    assert {name: item["success"] for name, item in scenarios.items()} == dict.fromkeys(scenarios, True), scenarios
    assert scenarios["order status from the lookup"]["answer"] == "Your order is shipped."
    assert "handover" in scenarios["complaint handed over"]["nodes_run"]
    business, performance, safety = report["scores"]["business"], report["scores"]["performance"], \
        report["scores"]["safety"]
    assert (business["scenarios"], business["task_success_rate"], business["path_correctness"]) == (4, 1.0, 1.0)
    assert performance["latency_p50_ms"] > 0 and performance["nodes_per_task"] >= 4
    assert safety["probes"] == 2 and safety["categories"]["direct_injection"]["attack_success_rate"] == 0.0
    # A second workflow from the template reuses the tool it made.
    again = dev.post(TEMPLATES, {"template": "support-triage", "name": "Triage 2",
                                 "bindings": {"model": MODEL, "knowledge_base": faq_kb.pk}}, format="json")
    assert again.status_code == 201 and Tool.objects.count() == 1


def test_document_review_extracts_json_and_checks_it_with_code(dev, model_replies):
    created = _create(dev, "document-review", model=MODEL)
    assert created.status_code == 201, created.json()

    report = _evaluate(dev, created.json()["id"])

    results = {item["name"]: item for item in report["results"]}
    approved = results["a complete contract is approved"]
    assert approved["success"] and json.loads(approved["answer"])["fields"]["amount"] == 12500
    flagged = json.loads(results["a contract without an amount is flagged"]["answer"])
    assert flagged["verdict"] == "needs review" and "the amount is not a positive number" in flagged["problems"]
    assert report["scores"]["business"]["task_success_rate"] == 1.0
    assert report["scores"]["safety"]["probes"] == 0  # not chat-shaped: no message to attack through


def test_bilingual_faq_answers_in_the_question_language(dev, faq_kb, model_replies):
    created = _create(dev, "bilingual-faq", model=MODEL, knowledge_base=faq_kb.pk)
    assert created.status_code == 201, created.json()

    report = _evaluate(dev, created.json()["id"])

    results = {item["name"]: item for item in report["results"] if item["type"] == "scenario"}
    assert results["a Chinese question gets a Chinese answer"]["answer"] == "退货期限为三十天。"
    assert all(item["success"] for item in results.values()), results
    assert report["scores"]["business"]["task_success_rate"] == 1.0


def test_a_failing_scenario_fails_its_business_score(dev, faq_kb, model_replies):
    created = _create(dev, "bilingual-faq", model=MODEL, knowledge_base=faq_kb.pk).json()
    scenario = dev.post(f"/api/workflows/{created['id']}/scenarios/", {
        "name": "wrong language", "inputs": {"question": "How long is the warranty?"},
        "checks": [{"kind": "contains", "value": "保修"}], "expected_nodes": ["answer_zh"]}, format="json")
    assert scenario.status_code == 201, scenario.json()
    bad = dev.post(f"/api/workflows/{created['id']}/scenarios/", {
        "name": "ghost node", "inputs": {"question": "Hi"}, "expected_nodes": ["ghost"]}, format="json")
    assert bad.status_code == 400 and "ghost" in bad.json()["error"]["message"]

    report = _evaluate(dev, created["id"])

    failed = next(item for item in report["results"] if item["name"] == "wrong language")
    assert not failed["success"] and failed["path_correctness"] == 0.0
    assert report["scores"]["business"]["task_success_rate"] == pytest.approx(2 / 3)


def test_an_evaluation_is_cancelled_before_it_runs(dev):
    created = _create(dev, "document-review", model=MODEL).json()
    started = dev.post(f"/api/workflows/{created['id']}/evaluations/", {"include_safety": False},
                       format="json").json()

    cancelled = dev.post(f"/api/workflows/evaluations/{started['id']}/cancel/")

    assert cancelled.status_code == 200 and cancelled.json()["status"] == EvalStatus.CANCELLED
    evaluation.run(started["id"])
    assert WorkflowEvalRun.objects.get().progress == 0
    again = dev.post(f"/api/workflows/evaluations/{started['id']}/cancel/")
    assert again.status_code == 409 and "only a queued or running one" in again.json()["error"]["message"]
