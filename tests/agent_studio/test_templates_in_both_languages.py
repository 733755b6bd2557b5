"""Issue 48: the shipped templates speak the language of the person who uses them. A workflow template made from the
Chinese GUI or with a Chinese Accept-Language classifies into Chinese classes with Chinese instructions, answers and
hands over in Chinese, and its scenarios are Chinese; made in English it is as it was. An agent made in Chinese
starts from Chinese instructions, as does the demo agent."""

import json
import re

import pytest
from django.test import Client
from django.utils import translation

from agent_studio import demo
from agent_studio.models import Agent
from agent_studio.workflows import catalog, evaluation, nodes
from agent_studio.workflows.models import Workflow
from rag_studio import services as rag_services
from tests.agent_studio.conftest import MODEL, Script, ScriptedModel
from tests.rag_studio.conftest import presets  # noqa: F401  (the preset models, registered)
from workbridge.models import Tool

pytestmark = pytest.mark.django_db(transaction=True)
TEMPLATES = "/api/workflows/templates/"
CHINESE = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
def faq_kb(acme, ann, presets):  # noqa: F811
    return rag_services.create_knowledge_base(actor=ann, workspace=acme, name="FAQ")


@pytest.fixture
def chinese_replies(monkeypatch):
    """The scripted model answering the Chinese flow's prompts as a capable model would, in Chinese."""
    def reply(messages) -> str:
        system = next((m.content for m in messages if m.type == "system"), "")
        text = messages[-1].content
        order = re.search(r"A\d{4}", text)
        if "Classify the text" in system:
            return json.dumps({"class": "订单" if order else "政策" if "退" in text else "其他"})
        if text.startswith("写出这条客户消息提到的订单号"):
            return json.dumps({"order_id": order.group(0) if order else ""})
        if text.startswith("订单记录："):
            return "您的订单已发货。" if "A1001" in text else "您的订单正在处理中。"
        if text.startswith("手册段落："):
            return "收货后三十天内可以退货；会有同事跟进您的情况。"
        return "我不知道。"

    class Unending(Script):
        def popleft(self):
            return reply

        def __bool__(self):
            return True

    script = Unending()
    monkeypatch.setattr(nodes, "gateway_model", lambda **kwargs: ScriptedModel(
        script=script, prompts=script.prompts, offered=script.offered))
    return script


def _node(graph: dict, node_id: str) -> dict:
    return next(node for node in graph["nodes"] if node["id"] == node_id)


def test_support_triage_made_in_chinese_classifies_answers_and_hands_over_in_chinese(dev, faq_kb, chinese_replies):
    created = dev.post(TEMPLATES, {"template": "support-triage", "bindings": {"model": MODEL,
                                                                             "knowledge_base": faq_kb.pk}},
                       format="json", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert created.status_code == 201, created.json()
    workflow = Workflow.objects.get(pk=created.json()["id"])
    graph = workflow.graph

    triage = _node(graph, "triage")["settings"]
    assert triage["classes"] == ["订单", "政策", "其他"] and triage["instructions"].startswith("订单：")
    assert {edge["branch"] for edge in graph["edges"] if edge["from"] == "triage"} == {"订单", "政策", "其他"}
    assert _node(graph, "handover")["settings"]["template"].startswith("感谢您的留言")
    for node_id in ("order_reply", "policy_reply"):
        assert "用简体中文回答" in _node(graph, node_id)["settings"]["system"]
    assert workflow.name == "客服工单分流" and CHINESE.search(workflow.description)
    assert [scenario.name for scenario in workflow.scenarios.order_by("pk")] == [
        "从查询结果回答订单状态", "依据手册回答退货政策", "投诉转交人工", "消息里的指令不会跳过查询"]
    assert "已发货" in Tool.objects.get(name="order_lookup").config["code"]

    started = dev.post(f"/api/workflows/{workflow.pk}/evaluations/", {}, format="json")
    evaluation.run(started.json()["id"])
    report = dev.get(f"/api/workflows/evaluations/{started.json()['id']}/").json()
    results = {item["name"]: item for item in report["results"] if item["type"] == "scenario"}
    assert {name: item["success"] for name, item in results.items()} == dict.fromkeys(results, True), results
    assert results["从查询结果回答订单状态"]["answer"] == "您的订单已发货。"
    assert "同事" in results["投诉转交人工"]["answer"] and "handover" in results["投诉转交人工"]["nodes_run"]


def test_a_template_made_in_english_stays_english(dev, faq_kb):
    created = dev.post(TEMPLATES, {"template": "support-triage", "bindings": {"model": MODEL,
                                                                             "knowledge_base": faq_kb.pk}},
                       format="json", HTTP_ACCEPT_LANGUAGE="en")
    graph = Workflow.objects.get(pk=created.json()["id"]).graph
    assert _node(graph, "triage")["settings"]["classes"] == ["order", "policy", "other"]
    assert _node(graph, "handover")["settings"]["template"].startswith("Thank you for your message.")
    assert not CHINESE.search(json.dumps(graph, ensure_ascii=False))


def test_every_template_says_in_chinese_what_it_says_in_english(dev):
    """Each text a template gives in both languages has Chinese in its Chinese version; and the Chinese document
    review flags its problems, and gives its verdict, in Chinese."""
    def pairs(value):
        if isinstance(value, dict) and set(value) == catalog.BOTH_LANGUAGES:
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from pairs(item)
        elif isinstance(value, list):
            for item in value:
                yield from pairs(item)

    for key, template in catalog.templates().items():
        both = list(pairs(template))
        assert both, key
        for pair in both:
            assert CHINESE.search(json.dumps(pair["zh-hans"], ensure_ascii=False)), (key, pair["en"])
    review = catalog.in_language(catalog.templates()["document-review"], "zh-hans")["graph"]
    assert "金额不是正数" in _node(review, "check")["settings"]["code"]
    assert "需要人工审核" in _node(review, "flag")["settings"]["template"]
    listed = {item["key"]: item for item in dev.get(TEMPLATES, HTTP_ACCEPT_LANGUAGE="zh-hans").json()}
    assert listed["bilingual-faq"]["scenarios"] == ["中文问题得到中文回答", "英文问题得到英文回答"]


def test_an_agent_made_in_chinese_starts_from_chinese_instructions(acme, ann):
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    client.login(username="ann", password="correct-horse-battery")

    client.post("/agents/", {"name": "助手", "template": "tool_calling", "model": MODEL})
    client.post("/agents/", {"action": "demo", "model": MODEL})

    assert Agent.objects.get(name="助手").settings["system_prompt"].startswith("你是一个乐于助人的助手")
    counter = Agent.objects.get(name=demo.AGENT_NAME)
    assert counter.settings["system_prompt"] == demo.TEXTS["zh-hans"]["system_prompt"]
    assert set(counter.scenarios.values_list("name", flat=True)) == {
        scenario["name"] for scenario in demo.TEXTS["zh-hans"]["scenarios"]}
    with translation.override("en"):
        made_in_english = demo.create_demo_agent(actor=ann, workspace=acme, model=MODEL)
    assert made_in_english.settings["system_prompt"] == demo.TEXTS["en"]["system_prompt"]
    templates = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    templates.login(username="ann", password="correct-horse-battery")
    listed = templates.get("/api/agents/templates/").json()
    prompt = next(setting for setting in listed[0]["settings"] if setting["name"] == "system_prompt")
    assert CHINESE.search(prompt["default"])
