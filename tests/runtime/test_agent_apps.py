"""Agents published as apps, on the real platform (SmolLM2 through the gateway, runs on the Celery worker): the
chat API as JSON and as server-sent events with a step event per model and tool call, conversations that continue on
the agent's own thread, the official `openai` client, and a plan-and-execute app whose plan comes back for approval
and runs as the caller edited it."""

import json

import httpx
import pytest
from django.contrib.auth import get_user_model
from openai import OpenAI

from accounts.services import Actor, create_workspace
from agent_studio import services as agent_services
from agent_studio.models import AgentRun, AgentThread
from runtime import services
from runtime.models import Trace, TraceStatus
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush
from workbridge import services as workbridge

pytestmark = pytest.mark.worker
QUESTION = "How many words are in the text 'apples bananas cherries dates'? Use the word_count tool."


@pytest.fixture(scope="module")
def published(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        owner = get_user_model().objects.create_user(username="agent-publisher", password="x" * 12)
        actor = Actor(user=owner)
        workspace = create_workspace(actor=actor, name="Agent apps")
        tool = workbridge.save_tool(
            actor=actor, workspace=workspace, name="word_count", description="Count the words of a text.",
            binding="python", config={"code": "def run(args):\n    return {'words': len(args['text'].split())}\n"},
            parameters={"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
        settings = {"model": SMOLLM2, "tools": [tool.pk], "generation": {"temperature": 0.0}}
        counter = agent_services.save_agent(actor=actor, workspace=workspace, name="counter",
                                            template="tool_calling", settings=settings)
        planner = agent_services.save_agent(actor=actor, workspace=workspace, name="planner",
                                            template="plan_execute",
                                            settings=settings | {"planning": {"max_plan_steps": 2}})
        apps, keys = {}, {}
        for agent in (counter, planner):
            apps[agent.name] = services.publish_app(actor=actor, agent=agent, slug=f"{agent.name}-app")
            keys[agent.name] = services.create_app_key(actor=actor, app=apps[agent.name], name="test").secret
        yield {"url": web_server, "apps": apps, "keys": keys}
        stop_engines_and_flush(keep=SMOLLM2)


def _post(published, app: str, endpoint: str, body: dict) -> httpx.Response:
    return httpx.post(f"{published['url']}/api/apps/{app}-app/{endpoint}", json=body, timeout=300,
                      headers={"Authorization": f"Bearer {published['keys'][app]}"})


def _stream(published, app: str, endpoint: str, body: dict) -> list[tuple[str, dict]]:
    events, event = [], None
    with httpx.stream("POST", f"{published['url']}/api/apps/{app}-app/{endpoint}", json=body, timeout=300,
                      headers={"Authorization": f"Bearer {published['keys'][app]}"}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[6:])))
    return events


def test_an_agent_app_answers_as_json_and_as_events_with_its_steps_on_one_conversation(published, live_db):
    answered = _post(published, "counter", "chat", {"query": QUESTION, "user": "li"})
    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert body["status"] == "done" and body["answer"] and body["usage"]["tool_calls"] >= 1
    trace = Trace.objects.get(public_id=body["message_id"])
    assert trace.status == TraceStatus.OK and trace.agent_run.public_id.hex == body["run_id"].replace("-", "")

    events = _stream(published, "counter", "chat", {"query": "And in 'one two'?", "user": "li", "stream": True,
                                                    "conversation_id": body["conversation_id"]})

    kinds = [event for event, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and "step" in kinds and "token" in kinds
    assert "".join(data["text"] for event, data in events if event == "token").strip() == events[-1][1]["answer"]
    assert {data["kind"] for event, data in events if event == "step"} >= {"model", "answer"}
    second = AgentRun.objects.get(public_id=events[-1][1]["run_id"])
    assert str(second.thread.public_id) == body["conversation_id"]
    assert AgentThread.objects.get(public_id=body["conversation_id"]).runs.count() == 2


def test_the_official_openai_client_talks_to_an_agent_app(published, live_db):
    client = OpenAI(base_url=f"{published['url']}/api/apps/counter-app/v1", api_key=published["keys"]["counter"],
                    max_retries=0, timeout=300)
    reply = client.chat.completions.create(model="counter-app", messages=[{"role": "user", "content": QUESTION}])
    assert reply.choices[0].message.content and reply.model_extra["status"] == "done"
    assert reply.usage.completion_tokens > 0


def test_a_plan_comes_back_for_approval_and_runs_as_the_caller_edited_it(published, live_db):
    paused = _post(published, "planner", "chat", {"query": "Count the words in 'red green blue'."}).json()
    assert paused["status"] == "awaiting_approval" and paused["plan"], paused
    assert paused["approve_url"] == f"/api/apps/planner-app/runs/{paused['run_id']}/approve"
    assert Trace.objects.get(public_id=paused["message_id"]).status == TraceStatus.AWAITING

    empty = _post(published, "planner", f"runs/{paused['run_id']}/approve", {"plan": []})
    stranger = _post(published, "counter", f"runs/{paused['run_id']}/approve", {"plan": ["x"]})
    assert empty.status_code == 400 and "at least one step" in empty.json()["error"]["message"]
    assert stranger.status_code == 404

    edited = ["Count the words of 'red green blue' with the word_count tool"]
    events = _stream(published, "planner", f"runs/{paused['run_id']}/approve", {"plan": edited, "stream": True})

    assert events[-1][0] == "done" and events[-1][1]["answer"]
    approved = [data for event, data in events if event == "step" and data["name"] == "plan approved"]
    assert approved[0]["detail"] == {"steps": edited, "edited": edited != paused["plan"]}
    trace = Trace.objects.get(public_id=paused["message_id"])
    assert trace.status == TraceStatus.OK and trace.answer == events[-1][1]["answer"]
    again = _post(published, "planner", f"runs/{paused['run_id']}/approve", {"plan": edited})
    assert again.status_code == 409


def test_an_agent_app_has_no_retrieve_endpoint(published, live_db):
    refused = _post(published, "counter", "retrieve", {"query": "x"})
    assert refused.status_code == 400 and "serves an agent" in refused.json()["error"]["message"]
