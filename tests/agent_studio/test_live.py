"""Agents on the real platform: SmolLM2-135M through the gateway, runs on Celery workers, steps streamed over SSE
from the web server, and a worker killed mid-run whose run continues from its checkpoint."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model

from accounts.services import Actor, create_api_key, create_workspace
from agent_studio import memory, services, tasks
from agent_studio.models import AgentRun, AgentThread, RunStep, ThreadSource
from agent_studio.runs.fields import RunStatus
from serving.presets import SMOLLM2
from tests.conftest import ROOT, WORKER_NODE, deploy_presets, platform_env, stop_engines_and_flush, wait_for
from workbridge import services as workbridge
from workbridge.models import Invocation

pytestmark = pytest.mark.worker
QUESTION = "How many words are in the text 'apples bananas cherries dates'? Use the word_count tool."


@pytest.fixture(scope="module")
def platform(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        owner = get_user_model().objects.create_user(username="agent-owner", password="x" * 12)
        actor = Actor(user=owner)
        workspace = create_workspace(actor=actor, name="Agents live")
        tool = workbridge.save_tool(
            actor=actor, workspace=workspace, name="word_count", description="Count the words of a text.",
            binding="python", config={"code": "def run(args):\n    return {'words': len(args['text'].split())}\n"},
            parameters={"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
        agent = services.save_agent(actor=actor, workspace=workspace, name="counter", template="tool_calling",
                                    settings={"model": SMOLLM2, "tools": [tool.pk],
                                              "generation": {"temperature": 0.0}})
        key = create_api_key(actor=actor, workspace=workspace, name="live").secret
        yield {"url": web_server, "actor": actor, "agent": agent, "tool": tool, "key": key}
        stop_engines_and_flush(keep=SMOLLM2)


def _events(url: str, key: str, run_id: str) -> list[tuple[str, dict]]:
    received = []
    with httpx.stream("GET", f"{url}/api/agents/runs/{run_id}/events/", headers={"Authorization": f"Bearer {key}"},
                      timeout=300) as response:
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                received.append((event, json.loads(line[6:])))
    return received


def test_the_demo_agent_calls_its_tool_on_smollm2_and_its_steps_stream_from_the_web_server(platform, live_db):
    headers = {"Authorization": f"Bearer {platform['key']}"}
    started = httpx.post(f"{platform['url']}/api/agents/{platform['agent'].pk}/runs/", json={"input": QUESTION},
                         headers=headers, timeout=30)
    assert started.status_code == 202, started.text

    events = _events(platform["url"], platform["key"], started.json()["run_id"])

    kinds = [event for event, _data in events]
    assert kinds[-1] == "done", events[-1]
    tool_steps = [data for event, data in events if event == "step" and data["kind"] == "tool"]
    assert tool_steps[0]["name"] == "word_count" and tool_steps[0]["detail"]["result"] == '{"words": 4}'
    model_steps = [data for event, data in events if event == "step" and data["kind"] == "model"]
    assert all(step["output_tokens"] and step["latency_ms"] > 0 for step in model_steps)
    assert events[-1][1]["answer"] and events[-1][1]["usage"]["tool_calls"] >= 1
    # The respond step, offered no tools, writes the answer: never the JSON of the call, as the tool-call schema's
    # replies are; its words arrive as tokens before the run is done.
    answer = events[-1][1]["answer"]
    assert '"arguments"' not in answer and not answer.startswith('{"name"'), answer
    tokens = [data["text"] for event, data in events if event == "token"]
    assert tokens and "".join(tokens).strip() == answer
    assert Invocation.objects.filter(tool=platform["tool"], caller="agent:counter").exists()


def test_the_probe_suggests_a_strategy_that_makes_a_tool_call_on_smollm2(platform, live_db):
    response = httpx.post(f"{platform['url']}/api/agents/{platform['agent'].pk}/suggest-strategy/",
                          headers={"Authorization": f"Bearer {platform['key']}"}, timeout=300)
    found = response.json()
    assert response.status_code == 200 and found["results"][found["suggested"]]["ok"], found
    assert "get_local_time" in found["results"][found["suggested"]]["detail"]


def _killable_worker(name: str, env: dict) -> subprocess.Popen:
    log = Path(os.environ["FACTORY_DATA_DIR"]) / f"{name}.log"
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues", name, "--hostname",
         f"{name}@{WORKER_NODE}", "--concurrency", "1", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env={**os.environ, **env}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)


def _checkpointed_tool_result(run: AgentRun) -> bool:
    saved = memory.checkpointer().get_tuple({"configurable": {"thread_id": memory.thread_key(run.thread)}})
    messages = saved.checkpoint["channel_values"].get("messages", []) if saved else []
    return any(getattr(message, "type", "") == "tool" for message in messages)


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_taken_over_and_the_run_continues_from_its_checkpoint(platform, web_port,
                                                                                          live_db):
    agent = platform["agent"]
    thread = AgentThread.objects.create(agent=agent, end_user="kill-test", source=ThreadSource.DEBUG)
    run = AgentRun.objects.create(workspace=agent.workspace, agent=agent, version=agent.versions.first(),
                                  thread=thread, caller="test", input=QUESTION, created_by=platform["actor"].user)
    worker = _killable_worker("agent-kill-test", {**platform_env(web_port), "FACTORY_RUN_LEASE_S": "4"})
    try:
        tasks.execute_run.apply_async(args=[run.pk, None], queue="agent-kill-test")
        wait_for(lambda: _checkpointed_tool_result(run), timeout=240, what="the tool's result in the checkpoint")
        os.killpg(worker.pid, signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.attempts == 1

    wait_for(lambda: tasks.resume_stalled_runs() == 1 or AgentRun.objects.get(pk=run.pk).attempts > 1, timeout=30,
             interval=1, what="the lease to run out and the run to be dispatched again")
    wait_for(lambda: AgentRun.objects.get(pk=run.pk).finished, timeout=240, what="the run to finish elsewhere")

    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error
    assert run.attempts == 2 and run.answer
    assert RunStep.objects.filter(run=run, kind="tool").count() == 1
    assert Invocation.objects.filter(tool=platform["tool"], caller="agent:counter",
                                     created_at__gte=run.created_at).count() == 1
