"""Workflows published as apps: the app API answers as JSON, as server-sent events with each node's start and
record and the answer's tokens, and on the OpenAI-compatible endpoint through the official `openai` client; a
workflow that is not chat-shaped gets a clear 400 there; every call's trace points at the run and its per-node
records, shown on the app's logs; the app travels in a signed bundle with the tool it uses.

The model is scripted (tests/agent_studio/conftest.py); the runs are run by this process's own worker thread, as the
Celery worker runs them, so that the scripted model applies; everything else is real: the ASGI front end, Redis
event streams, the sandbox the tool runs in, the database."""

import asyncio
import html
import json
import threading

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from openai import AsyncOpenAI

from agent_studio.runs.fields import RunStatus
from agent_studio.workflows import nodes, runner
from agent_studio.workflows.models import NodeRun, Workflow, WorkflowRun, WorkflowScenario
from factory.asgi import application
from rag_studio import services as rag_services
from runtime.access import own_origin
from runtime.models import App, Channel, Trace, TraceStatus
from tests.agent_studio import conftest as studio
from tests.agent_studio.conftest import MODEL, Script, ScriptedModel
from tests.rag_studio.conftest import presets  # noqa: F401  (the preset models, for a knowledge base)
from workbridge.models import Invocation, Tool

pytestmark = pytest.mark.django_db(transaction=True)
# Agent Studio's workspace (with the chat deployment the scripted model stands in for), its users and its tool.
chat_deployment, acme, ann, dev, word_count = (studio.chat_deployment, studio.acme, studio.ann, studio.dev,
                                               studio.word_count)
WORKFLOWS = "/api/workflows/"
APPS = "/api/runtime/apps/"


@pytest.fixture
def replies(monkeypatch):
    script = Script()
    monkeypatch.setattr(nodes, "gateway_model", lambda **kwargs: ScriptedModel(
        script=script, prompts=script.prompts, offered=script.offered))
    return script


@pytest.fixture
def worker():
    """What the Celery worker does with queued workflow runs, in a thread of this process."""
    stop = threading.Event()

    def loop():
        try:
            while not stop.is_set():
                for pk in WorkflowRun.objects.filter(status=RunStatus.QUEUED).values_list("pk", flat=True):
                    runner.execute(pk, owner="test-worker")
                stop.wait(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


def chat_graph(word_count_id: int) -> dict:
    """A support reply: count the ticket's words with the tool, then the model writes the answer."""
    return {"inputs": [{"name": "question", "type": "string"}],
            "nodes": [{"id": "start", "kind": "start"},
                      {"id": "count", "kind": "tool", "settings": {"tool": word_count_id,
                                                                   "arguments": {"text": "{{start.question}}"}}},
                      {"id": "write", "kind": "llm", "settings": {
                          "model": MODEL, "prompt": "{{start.question}} ({{count.output.words}} words)"}},
                      {"id": "reply", "kind": "answer", "settings": {"answer": "{{write.output}}"}}],
            "edges": [{"from": "start", "to": "count"}, {"from": "count", "to": "write"},
                      {"from": "write", "to": "reply"}]}


def review_graph() -> dict:
    """Not chat-shaped: its input is a document, and a template answers."""
    return {"inputs": [{"name": "document", "type": "string"}, {"name": "reviewer", "type": "string"}],
            "nodes": [{"id": "start", "kind": "start"},
                      {"id": "reply", "kind": "answer",
                       "settings": {"answer": "{{start.reviewer}} reviewed: {{start.document}}"}}],
            "edges": [{"from": "start", "to": "reply"}]}


def publish(dev, graph: dict, slug: str) -> str:
    """Save the workflow, publish it through the API and return an app key."""
    saved = dev.post(WORKFLOWS, {"name": slug, "graph": graph}, format="json")
    assert saved.status_code == 201, saved.json()
    app = dev.post(APPS, {"workflow": saved.json()["id"], "slug": slug}, format="json")
    assert app.status_code == 201, app.json()
    assert app.json()["workflow"] == saved.json()["id"] and app.json()["release"]["workflow_version"] == 1
    return dev.post(f"{APPS}{slug}/keys/", {"name": "test"}, format="json").json()["secret"]


def call(path: str, body: dict, key: str, **headers) -> httpx.Response:
    async def send():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application),
                                     base_url="http://testserver") as client:
            return await client.post(path, json=body, headers={"Authorization": f"Bearer {key}", **headers},
                                     timeout=60)

    return asyncio.run(send())


def events_of(response: httpx.Response) -> list[tuple[str, dict]]:
    found, event = [], None
    for line in response.text.splitlines():
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            found.append((event, json.loads(line[len("data: "):])))
    return found


def test_a_published_workflow_answers_as_json_with_its_trace_per_node_on_the_logs(dev, ann, word_count, replies,
                                                                                   worker):
    key = publish(dev, chat_graph(word_count["id"]), "support")
    replies.append("Your order ships tomorrow.")

    answered = call("/api/apps/support/chat", {"query": "Where is order 42?", "user": "li"}, key)

    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert (body["status"], body["answer"]) == ("done", "Your order ships tomorrow.")
    assert replies.prompts[0][-1].content == "Where is order 42? (4 words)"
    trace = Trace.objects.get(public_id=body["message_id"])
    assert (trace.status, trace.channel, trace.query) == (TraceStatus.OK, Channel.CHAT, "Where is order 42?")
    assert str(trace.workflow_run.public_id) == body["run_id"] and trace.workflow_run.caller == "app:support"
    assert [row.node_id for row in NodeRun.objects.filter(run=trace.workflow_run)] == ["start", "count", "write",
                                                                                      "reply"]
    feedback = call("/api/apps/support/feedback", {"message_id": body["message_id"], "rating": "down"}, key)
    assert feedback.status_code == 200, feedback.text

    browser = Client()
    browser.force_login(ann.user)
    logs = browser.get("/apps/support/logs/").content.decode()
    assert "Where is order 42?" in logs
    page = browser.get(f"/apps/support/logs/{body['message_id']}/").content.decode()
    assert str(trace.workflow_run.public_id) in page
    assert page.count('class="node done"') == 4 and '{"words": 4}' in page.replace("&quot;", '"')
    assert "to-scenario" in page
    browser.post(f"/apps/support/logs/{body['message_id']}/", {"expected_answer": "It shipped on Monday."})
    scenario = WorkflowScenario.objects.get()
    assert scenario.inputs == {"question": "Where is order 42?"} and "shipped on Monday" in scenario.checks[0]["value"]
    assert "Logs" in browser.get("/apps/support/monitoring/").content.decode()
    assert dev.get(f"{APPS}support/monitoring/").json()["totals"]["down"] == 1


def test_the_chat_stream_carries_each_node_and_the_answer_tokens(dev, word_count, replies, worker):
    key = publish(dev, chat_graph(word_count["id"]), "support")
    replies.append("Your order ships tomorrow.")

    streamed = call("/api/apps/support/chat", {"query": "Where is order 42?", "stream": True}, key)

    assert streamed.status_code == 200 and streamed.headers["content-type"] == "text/event-stream"
    events = events_of(streamed)
    assert events[0][0] == "start" and events[-1][0] == "done"
    finished = {data["node"]: data for event, data in events if event == "node_finished"}
    started = [data["node"] for event, data in events if event == "node_started"]
    assert started == ["start", "count", "write", "reply"] and list(finished) == started
    assert finished["count"]["output"] == '{"words": 4}' and finished["count"]["latency_ms"] > 0
    tokens = [data["text"] for event, data in events if event == "token"]
    assert len(tokens) == 4 and "".join(tokens) == "Your order ships tomorrow."
    # The tokens come as the model writes them, before its node's record.
    written = events.index(("node_finished", finished["write"]))
    assert all(event != "token" for event, _ in events[written:])
    assert events[-1][1]["answer"] == "Your order ships tomorrow."


def test_the_official_openai_client_talks_to_a_chat_shaped_workflow(dev, word_count, replies, worker):
    key = publish(dev, chat_graph(word_count["id"]), "support")
    replies.extend(["Ships tomorrow.", "It ships on Friday."])

    async def talk():
        client = AsyncOpenAI(base_url="http://testserver/api/apps/support/v1", api_key=key, max_retries=0,
                             http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=application)))
        answered = await client.chat.completions.create(model="support", messages=[
            {"role": "user", "content": "Where is order 42?"}])
        stream = await client.chat.completions.create(model="support", stream=True, messages=[
            {"role": "user", "content": "Where is order 42?"}, {"role": "assistant", "content": "Ships tomorrow."},
            {"role": "user", "content": "Which day exactly?"}])
        pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
        return answered, pieces

    answered, pieces = asyncio.run(talk())

    assert answered.choices[0].message.content == "Ships tomorrow."
    assert answered.usage.total_tokens >= 0 and answered.model == "support"
    assert "".join(piece or "" for piece in pieces) == "It ships on Friday." and len(pieces) > 3
    assert replies.prompts[1][-1].content.startswith("Which day exactly?")
    assert set(Trace.objects.values_list("channel", flat=True)) == {Channel.OPENAI}


def test_a_workflow_that_is_not_chat_shaped_takes_inputs_and_refuses_chat_messages_clearly(dev, worker):
    key = publish(dev, review_graph(), "review")

    refused = call("/api/apps/review/v1/chat/completions", {"model": "review", "messages": [
        {"role": "user", "content": "Review this."}]}, key)
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "not chat-shaped" in message and "document (string, required)" in message and '"inputs"' in message
    assert call("/api/apps/review/chat", {"query": "Review this."}, key).status_code == 400
    missing = call("/api/apps/review/chat", {"inputs": {"document": "A lease."}}, key)
    assert (missing.status_code, missing.json()["error"]["message"]) == (400, "The input 'reviewer' is required.")

    answered = call("/api/apps/review/chat", {"inputs": {"document": "A lease.", "reviewer": "Li"}}, key)

    assert answered.status_code == 200, answered.text
    assert answered.json()["answer"] == "Li reviewed: A lease."
    streamed = events_of(call("/api/apps/review/chat", {"inputs": {"document": "A lease.", "reviewer": "Li"},
                                                        "stream": True}, key))
    # A template wrote the answer: it comes as one token when the run is done.
    assert [data["text"] for event, data in streamed if event == "token"] == ["Li reviewed: A lease."]
    assert Trace.objects.filter(status=TraceStatus.OK).count() == 2


def test_a_failed_node_is_a_502_for_the_caller_and_its_reason_in_the_trace(dev, word_count, replies, worker):
    graph = chat_graph(word_count["id"])
    graph["nodes"][1]["settings"]["arguments"] = {"words": "{{start.question}}"}  # not the tool's argument
    key = publish(dev, graph, "broken")

    failed = call("/api/apps/broken/chat", {"query": "Where is order 42?"}, key)

    assert failed.status_code == 502 and "logs" in failed.json()["error"]["message"]
    trace = Trace.objects.get()
    assert trace.status == TraceStatus.ERROR and "Node 'count' failed" in trace.error
    assert events_of(call("/api/apps/broken/chat", {"query": "Again?", "stream": True}, key))[-1][0] == "error"


def test_a_published_workflow_cannot_be_deleted_and_a_republish_serves_its_new_version(dev, word_count, worker):
    key = publish(dev, review_graph(), "review")
    workflow = Workflow.objects.get()
    refused = dev.delete(f"{WORKFLOWS}{workflow.pk}/")
    assert refused.status_code == 409 and "published as an app" in refused.json()["error"]["message"]
    graph = review_graph()
    graph["nodes"][1]["settings"]["answer"] = "{{start.reviewer}} approved: {{start.document}}"
    assert dev.put(f"{WORKFLOWS}{workflow.pk}/", {"name": "review", "graph": graph},
                   format="json").status_code == 200

    assert dev.post(f"{APPS}review/publish/", {}, format="json").json()["release"]["workflow_version"] == 2
    answered = call("/api/apps/review/chat", {"inputs": {"document": "A lease.", "reviewer": "Li"}}, key)
    assert answered.json()["answer"] == "Li approved: A lease."
    assert App.objects.get().current_release.workflow_version.number == 2


def _export(client, slug: str) -> bytes:
    response = client.get(f"{APPS}{slug}/export/")
    assert response.status_code == 200, response.content[:300]
    return b"".join(response.streaming_content)


def _import(client, data: bytes):
    return client.post("/api/assets/import/", {"bundle": SimpleUploadedFile("app.zip", data)}, format="multipart")


def test_a_workflow_app_travels_in_a_signed_bundle_with_its_tool_and_refuses_a_missing_knowledge_base(
        dev, ann, word_count, replies, worker, make_workspace, key_client, presets):  # noqa: F811
    key = publish(dev, chat_graph(word_count["id"]), "support")
    dev.patch(f"{APPS}support/", {"opener": "Hello.", "rate_limit": 7}, format="json")
    bundle = _export(dev, "support")
    globex = make_workspace("Globex", "gil")
    gil = key_client("gil", globex, role="owner")

    imported = _import(gil, bundle)

    assert imported.status_code == 201, imported.json()
    app = App.objects.get(workspace=globex)
    tool = Tool.objects.get(workspace=globex)
    assert (app.slug, app.opener, app.default_rate_limit, tool.name) == ("support-2", "Hello.", 7, "word_count")
    count = next(node for node in app.workflow.graph["nodes"] if node["id"] == "count")
    assert count["settings"]["tool"] == tool.pk != word_count["id"]
    assert {asset["kind"] for asset in imported.json()["assets"]} >= {"workflow", "app", "tool"}
    new_key = gil.post(f"{APPS}support-2/keys/", {"name": "test"}, format="json").json()["secret"]
    replies.append("Ships tomorrow.")
    answered = call("/api/apps/support-2/chat", {"query": "Where is order 42?"}, new_key)
    assert answered.json()["answer"] == "Ships tomorrow." and key != new_key
    assert Invocation.objects.filter(tool=tool).count() == 1

    kb = rag_services.create_knowledge_base(actor=ann, workspace=App.objects.get(slug="support").workspace,
                                            name="Handbook")
    graph = chat_graph(word_count["id"])
    graph["nodes"].insert(1, {"id": "search", "kind": "knowledge", "settings": {"knowledge_base": kb.pk,
                                                                                "query": "{{start.question}}"}})
    graph["edges"] = [{"from": "start", "to": "search"}, {"from": "search", "to": "count"}, *graph["edges"][1:]]
    publish(dev, graph, "handbook")

    refused = _import(gil, _export(dev, "handbook"))

    assert refused.status_code == 400
    assert "uses what this workspace lacks: knowledge base 'Handbook'" in refused.json()["error"]["message"]
    assert App.objects.filter(workspace=globex).count() == 1 and Workflow.objects.filter(workspace=globex).count() == 1


def test_a_workflow_is_published_from_the_apps_page_and_answers_in_its_web_chat(dev, ann, replies, worker):
    saved = dev.post(WORKFLOWS, {"name": "faq", "graph": chat_graph_without_tool()}, format="json").json()
    browser = Client()
    browser.force_login(ann.user)
    assert f'value="workflow:{saved["id"]}"' in browser.get(f"/apps/?workflow={saved['id']}").content.decode()

    published = browser.post("/apps/", {"source": f"workflow:{saved['id']}", "name": "FAQ", "slug": "faq"})

    assert published.status_code == 302 and published.url == "/apps/faq/"
    page = html.unescape(browser.get("/apps/faq/").content.decode())
    assert f"/workflows/{saved['id']}/" in page and "node_finished" in page and '{"question": "…"}' in page
    app = App.objects.get(slug="faq")
    assert browser.get(f"/apps/faq/widget?token={app.widget_token}").status_code == 200
    replies.append("Hello from the FAQ.")
    answered = call("/api/apps/faq/chat", {"query": "Hi?"}, app.widget_token, Origin=own_origin())
    assert answered.status_code == 200, answered.text
    assert answered.json()["answer"] == "Hello from the FAQ."
    assert Trace.objects.get().channel == Channel.WIDGET


def chat_graph_without_tool() -> dict:
    return {"inputs": [{"name": "question", "type": "string"}],
            "nodes": [{"id": "start", "kind": "start"},
                      {"id": "write", "kind": "llm", "settings": {"model": MODEL, "prompt": "{{start.question}}"}},
                      {"id": "reply", "kind": "answer", "settings": {"answer": "{{write.output}}"}}],
            "edges": [{"from": "start", "to": "write"}, {"from": "write", "to": "reply"}]}
