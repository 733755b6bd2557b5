"""A published app on the real platform: the sample documents indexed by the Celery worker, SmolLM2 behind the
gateway, and the app called over HTTP as JSON, as server-sent events, and with the official OpenAI client."""

import json

import httpx
import pytest
from django.contrib.auth import get_user_model
from openai import OpenAI

from accounts.services import Actor, create_workspace
from rag_studio import services as rag_services
from rag_studio.models import DocumentStatus
from runtime import services
from runtime.models import Channel, Trace, TraceStatus
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush, wait_for
from tests.rag_studio.conftest import SAMPLE_FILES, sample

pytestmark = pytest.mark.worker
QUESTION = "How many days of annual leave do employees get?"


@pytest.fixture(scope="module")
def published(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        owner = Actor(user=get_user_model().objects.create_user(username="app-owner", password="x" * 12))
        workspace = create_workspace(actor=owner, name="Northwind apps")
        kb = rag_services.create_knowledge_base(actor=owner, workspace=workspace, name="Northwind")
        rag_services.upload_documents(actor=owner, kb=kb, uploads=[sample(n) for n in SAMPLE_FILES])
        wait_for(lambda: kb.documents.filter(status=DocumentStatus.INDEXED).count() == 3, timeout=120,
                 what="the worker to index the samples")
        config = rag_services.save_rag_config(actor=owner, workspace=workspace, name="Handbook", knowledge_base=kb,
                                              template="citations", model=SMOLLM2, generation={"max_tokens": 48})
        app = services.publish_app(actor=owner, config=config, slug="northwind")
        key = services.create_app_key(actor=owner, app=app, name="tests").secret
        yield {"url": web_server, "key": key, "app": app, "owner": owner, "config": config}
        stop_engines_and_flush(keep=SMOLLM2)


def _post(published, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{published['url']}/api/apps/northwind/{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {published['key']}"}, **kwargs)


def test_a_json_answer_cites_its_sources_and_is_traced_turn_by_turn(published, live_db):
    first = _post(published, "chat", {"query": QUESTION, "user": "emp-42"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["answer"].strip()
    assert body["citations"] and {"document", "chunk_id", "score", "n"} <= set(body["citations"][0])
    assert any(c["document"] == "northwind-employee-handbook.pdf" for c in body["citations"])
    assert body["usage"]["completion_tokens"] > 0 and body["timings_ms"]["ttft"] > 0

    second = _post(published, "chat", {"query": "And how many can be carried over?", "user": "emp-42",
                                       "conversation_id": body["conversation_id"]}).json()
    assert second["conversation_id"] == body["conversation_id"]
    stranger = _post(published, "chat", {"query": QUESTION, "user": "emp-7",
                                         "conversation_id": body["conversation_id"]})
    assert stranger.status_code == 404

    trace = Trace.objects.get(public_id=body["message_id"])
    assert (trace.status, trace.channel, trace.end_user, trace.deployment) == (
        TraceStatus.OK, Channel.CHAT, "emp-42", SMOLLM2)
    assert trace.answer == body["answer"] and trace.hits and trace.output_tokens > 0
    assert trace.ttft_ms > 0 and trace.latency_ms >= trace.ttft_ms and trace.release.number == 1
    assert trace.conversation.traces.count() == 2


def _events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_a_streamed_answer_sends_citations_tokens_and_done(published, live_db):
    with httpx.stream("POST", f"{published['url']}/api/apps/northwind/chat", timeout=120,
                      headers={"Authorization": f"Bearer {published['key']}"},
                      json={"query": QUESTION, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response.read().decode())
    names = [name for name, _ in events]
    assert names[:2] == ["start", "citations"] and names[-1] == "done" and "token" in names, names
    done = events[-1][1]
    assert "".join(data["text"] for name, data in events if name == "token") == done["answer"]
    assert done["citations"] and events[1][1]["hits"][0]["scores"]["fused"] is not None
    assert Trace.objects.get(public_id=done["message_id"]).stream is True


def test_the_official_openai_client_works_unchanged_with_citations(published, live_db):
    client = OpenAI(base_url=f"{published['url']}/api/apps/northwind/v1", api_key=published["key"], max_retries=0)
    reply = client.chat.completions.create(model="northwind", messages=[{"role": "user", "content": QUESTION}])
    assert reply.choices[0].message.content.strip() and reply.choices[0].finish_reason == "stop"
    assert reply.model_extra["citations"] and reply.usage.completion_tokens > 0

    chunks = list(client.chat.completions.create(model="northwind", stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": QUESTION}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"][0]
    assert text.strip() and final.model_extra["citations"] and chunks[-1].usage.completion_tokens > 0
    trace = Trace.objects.get(public_id=final.model_extra["message_id"])
    assert (trace.channel, trace.answer) == (Channel.OPENAI, text)


def test_a_client_that_leaves_mid_stream_leaves_a_cancelled_trace(published, live_db):
    before = set(Trace.objects.values_list("pk", flat=True))
    with httpx.stream("POST", f"{published['url']}/api/apps/northwind/chat", timeout=120,
                      headers={"Authorization": f"Bearer {published['key']}"},
                      json={"query": "Describe the whole product guide in detail.", "stream": True}) as response:
        for block in response.iter_text():
            if "event: token" in block:
                break
    wait_for(lambda: Trace.objects.exclude(pk__in=before).filter(status=TraceStatus.CANCELLED).exists(),
             timeout=30, what="the cancelled call's trace")


def test_republishing_switches_the_live_version_and_rollback_restores_it(published, live_db):
    owner, app = published["owner"], published["app"]
    config = rag_services.save_rag_config(actor=owner, workspace=app.workspace, config=published["config"],
                                          name="Handbook", knowledge_base=published["config"].knowledge_base,
                                          template="basic", model=SMOLLM2, generation={"max_tokens": 24})
    assert config.version == 2
    assert Trace.objects.get(public_id=_post(published, "retrieve", {"query": QUESTION}).json()["message_id"]) \
        .release.config_version.number == 1
    services.republish(actor=owner, app=app)
    served = _post(published, "chat", {"query": QUESTION}).json()
    assert Trace.objects.get(public_id=served["message_id"]).release.config_version.number == 2
    services.roll_back(actor=owner, app=app, number=1)
    served = _post(published, "chat", {"query": QUESTION}).json()
    trace = Trace.objects.get(public_id=served["message_id"])
    assert (trace.release.number, trace.release.config_version.number) == (3, 1)
