"""Agents built and run through the API: the tool-calling loop with a real Work Bridge tool, limits that hold,
plan-and-execute with an edited plan, every tool-calling strategy, memory variables, a team, and runs that end with
a recorded reason whatever goes wrong. The model's replies are scripted; everything else is real."""

import asyncio
import json
import threading

import httpx
import pytest
from django.db import connection
from django.test import Client
from langchain_core.messages import AIMessage

from agent_studio.models import Agent, AgentRun, RunStep, VariableValue
from agent_studio.runs.fields import RunStatus
from factory.asgi import application
from runtime import services as runtime_services
from tests.agent_studio.conftest import AGENTS, MODEL, call, run_inline
from tests.conftest import wait_for
from workbridge.models import Invocation

pytestmark = pytest.mark.django_db(transaction=True)


def _agent(dev, name="helper", template="tool_calling", **settings) -> dict:
    response = dev.post(AGENTS, {"name": name, "template": template, "settings": {"model": MODEL, **settings}},
                        format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _start(dev, agent: dict, text: str, **extra) -> dict:
    response = dev.post(f"{AGENTS}{agent['id']}/runs/", {"input": text, **extra}, format="json")
    assert response.status_code == 202, response.json()
    return response.json()


def _steps(run_id) -> list[tuple[str, str]]:
    return [(step.kind, step.name) for step in RunStep.objects.filter(run__public_id=run_id)]


def test_the_tool_calling_agent_calls_a_work_bridge_tool_and_answers_with_every_step_recorded(dev, word_count,
                                                                                              script):
    agent = _agent(dev, tools=[word_count["id"]])
    # After the tool's result the loop's reply is the JSON of the call again, as SmolLM2 held to the gateway's
    # tool-call schema writes it; the respond step, offered no tools, writes the answer.
    echoed = '{"name": "word_count", "arguments": {"text": "the quick brown fox"}}'
    script.extend([call("word_count", text="the quick brown fox"), echoed, "It has 4 words."])

    started = _start(dev, agent, "How many words in 'the quick brown fox'?")
    run = run_inline(started["run_id"])

    assert (run.status, run.answer) == (RunStatus.DONE, "It has 4 words.")
    assert _steps(run.public_id) == [("model", "model"), ("tool", "word_count"), ("model", "model"),
                                     ("model", "model"), ("answer", "answer")]
    assert script.offered == [["word_count"], ["word_count"], []]
    respond = script.prompts[-1]
    assert "Do not write JSON" in respond[0].content and echoed not in str([m.content for m in respond])
    assert respond[-1].content == ('Facts from the tools:\n- word_count(text="the quick brown fox") returned:\n'
                                   "  words: 4\n\nUsing these facts, answer: How many words in 'the quick brown fox'?")
    tool_step = RunStep.objects.get(run=run, kind="tool")
    assert (tool_step.detail["arguments"] == {"text": "the quick brown fox"}
            and '"words": 4' in tool_step.detail["result"])
    assert Invocation.objects.get().caller == "agent:helper"
    assert (run.model_calls, run.tool_calls) == (3, 1)
    detail = dev.get(f"{AGENTS}runs/{run.public_id}/").json()
    assert detail["answer"] == "It has 4 words." and [s["kind"] for s in detail["steps"]][-1] == "answer"


def test_a_repeated_call_is_not_made_again_and_the_conversation_keeps_the_answer(dev, word_count, script):
    agent = _agent(dev, tools=[word_count["id"]])
    script.extend([call("word_count", text="a b"), call("word_count", text="a b"), "Two words.", "Hello."])

    first = run_inline(_start(dev, agent, "Count 'a b'.")["run_id"])
    second = run_inline(_start(dev, agent, "Thanks!", thread_id=str(first.thread.public_id))["run_id"])

    assert (first.answer, first.tool_calls, Invocation.objects.count()) == ("Two words.", 1, 1)
    assert script.offered[2] == [] and second.answer == "Hello."
    # The loop's last words (the repeated call, dropped) gave way to the answer in the conversation.
    earlier = [(m.type, m.content) for m in script.prompts[3][1:] if not getattr(m, "tool_calls", None)]
    assert earlier[-2:] == [("ai", "Two words."), ("human", "Thanks!")]


def test_the_answer_after_tool_results_streams_token_by_token(dev, word_count, script):
    agent = _agent(dev, tools=[word_count["id"]])
    script.extend([call("word_count", text="one two three"), "{}", "The text has three words."])
    run = run_inline(_start(dev, agent, "Count 'one two three'.")["run_id"])

    body = b"".join(dev.get(f"{AGENTS}runs/{run.public_id}/events/")).decode()

    frames = [frame.split("\n") for frame in body.split("\n\n") if "event: " in frame]
    tokens = [json.loads(lines[-1][len("data: "):])["text"] for lines in frames if lines[1] == "event: token"]
    assert len(tokens) > 1 and "".join(tokens) == run.answer == "The text has three words."
    events = [lines[1][len("event: "):] for lines in frames]
    assert events.index("token") > events.index("step") and events[-1] == "done"


def test_a_model_that_loops_is_stopped_by_the_limits_with_the_reason(dev, word_count, script):
    agent = _agent(dev, tools=[word_count["id"]], limits={"max_steps": 4, "max_tool_calls": 2})
    script.extend([call("word_count", text=f"try {n}") for n in range(10)])

    run = run_inline(_start(dev, agent, "Count forever.")["run_id"])

    assert run.status == RunStatus.FAILED and "limit of 4 model calls" in run.error
    assert run.tool_calls == 2 and Invocation.objects.count() == 2
    assert RunStep.objects.filter(run=run, kind="error").get().detail["message"] == run.error


def test_a_plan_is_shown_edited_and_approved_then_each_step_runs(dev, word_count, script):
    agent = _agent(dev, name="planner", template="plan_execute", tools=[word_count["id"]])
    script.extend(['{"steps": ["Count the words", "Say hello"]}',
                   call("word_count", text="a b c"), "Three words.", "Done: 3.", "Counted 3 words."])

    paused = run_inline(_start(dev, agent, "Count the words of 'a b c'.")["run_id"])
    assert paused.status == RunStatus.AWAITING_APPROVAL and paused.plan == ["Count the words", "Say hello"]

    nonsense = dev.post(f"{AGENTS}runs/{paused.public_id}/approve/", {"plan": []}, format="json")
    too_long = dev.post(f"{AGENTS}runs/{paused.public_id}/approve/", {"plan": ["x"] * 200}, format="json")
    assert nonsense.status_code == 400 and "at least one step" in nonsense.json()["error"]["message"]
    assert too_long.status_code == 400 and "at most 20" in too_long.json()["error"]["message"]

    edited = ["Count the words of 'a b c' with the tool", "Report the count"]
    approved = dev.post(f"{AGENTS}runs/{paused.public_id}/approve/", {"plan": edited}, format="json")
    assert approved.status_code == 202 and approved.json()["status"] == "queued"
    done = run_inline(paused.pk, resume={"plan": edited})

    assert (done.status, done.answer) == (RunStatus.DONE, "Counted 3 words.")
    plans = RunStep.objects.filter(run=done, kind="plan").order_by("index")
    assert [p.name for p in plans] == ["plan", "plan approved"] and plans[1].detail == {"steps": edited,
                                                                                          "edited": True}
    assert Invocation.objects.count() == 1
    again = dev.post(f"{AGENTS}runs/{done.public_id}/approve/", {"plan": edited}, format="json")
    assert again.status_code == 409 and "only a run awaiting approval" in again.json()["error"]["message"]


def test_an_agent_app_streams_its_answer_as_several_token_events(dev, ann, word_count, script):
    agent = Agent.objects.get(pk=_agent(dev, tools=[word_count["id"]])["id"])
    key = runtime_services.create_app_key(
        actor=ann, app=runtime_services.publish_app(actor=ann, agent=agent, slug="counter"), name="test").secret
    script.extend([call("word_count", text="a b c"), "{}", "There are three words."])

    def worker():  # what the Celery worker does with the run the call queues
        try:
            run_inline(wait_for(lambda: AgentRun.objects.filter(caller="app:counter").first(), what="the run").pk)
        finally:
            connection.close()

    async def chat() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://testserver",
                                     timeout=60) as client:
            return await client.post("/api/apps/counter/chat", json={"query": "Count 'a b c'.", "stream": True},
                                     headers={"Authorization": f"Bearer {key}"})

    running = threading.Thread(target=worker)
    running.start()
    response = asyncio.run(chat())
    running.join()

    assert response.status_code == 200
    frames = [frame.split("\n") for frame in response.text.split("\n\n") if frame.startswith("event: ")]
    events = [(lines[0][len("event: "):], json.loads(lines[1][len("data: "):])) for lines in frames]
    tokens = [data["text"] for event, data in events if event == "token"]
    assert len(tokens) > 1 and "".join(tokens) == events[-1][1]["answer"] == "There are three words."
    assert events[0][0] == "start" and events[-1][0] == "done" and "step" in {event for event, _ in events}


@pytest.mark.parametrize("strategy, replies", [
    ("json", ['{"tool": "word_count", "arguments": {"text": "one two"}}', '{"final": "2"}', "Two words."]),
    ("react_text", ['Thought: count\nAction: word_count\nAction Input: {"text": "one two"}',
                    "Thought: done\nFinal Answer: 2", "Two words."]),
    ("native", [call("word_count", text="one two"), "2", "Two words."]),
])
def test_each_strategy_makes_the_same_tool_call_and_answer(dev, word_count, script, strategy, replies):
    agent = _agent(dev, tools=[word_count["id"]], tool_strategy=strategy)
    script.extend(replies)

    run = run_inline(_start(dev, agent, "Count 'one two'.")["run_id"])

    assert (run.status, run.answer) == (RunStatus.DONE, "Two words.")
    assert RunStep.objects.get(run=run, kind="tool").detail["arguments"] == {"text": "one two"}
    if strategy != "native":
        rendered = script.prompts[1]
        assert "word_count" in rendered[0].content and "Observation from word_count" in rendered[-1].content


def test_a_prompted_reply_that_never_parses_fails_the_run_after_one_retry(dev, word_count, script):
    agent = _agent(dev, tools=[word_count["id"]], tool_strategy="json")
    script.extend(["not json at all", '{"tool": "no_such_tool", "arguments": {}}'])

    run = run_inline(_start(dev, agent, "Count.")["run_id"])

    assert run.status == RunStatus.FAILED and "twice" in run.error and "no tool 'no_such_tool'" in run.error
    assert "could not be read" in script.prompts[1][-1].content


def test_variables_fill_the_prompt_are_written_by_the_agent_and_edited_per_conversation(dev, script):
    agent = _agent(dev, system_prompt="You serve {customer}. Tier: {tier}.", variables=[
        {"name": "customer", "type": "string", "scope": "conversation", "default": "a guest"},
        {"name": "tier", "type": "number", "scope": "end_user", "default": 1, "description": "loyalty tier"}])
    script.extend([call("set_variable", name="customer", value="Li Lei"), "Noted.", "Noted, Li Lei.",
                   "Hello again."])

    first = run_inline(_start(dev, agent, "My name is Li Lei.", user="li")["run_id"])
    assert first.answer == "Noted, Li Lei." and "You serve a guest. Tier: 1." in script.prompts[0][0].content
    assert "You serve Li Lei." in script.prompts[1][0].content and "You serve Li Lei." in script.prompts[2][0].content
    thread = str(first.thread.public_id)

    variables = f"{AGENTS}threads/{thread}/variables/"
    wrong = dev.put(variables, {"name": "tier", "value": "gold"}, format="json")
    assert wrong.status_code == 400 and "holds a number" in wrong.json()["error"]["message"]
    assert dev.put(variables, {"name": "tier", "value": 3}, format="json").status_code == 200
    shown = {v["name"]: v["value"] for v in dev.get(variables).json()["variables"]}
    assert shown == {"customer": "Li Lei", "tier": 3}

    second = run_inline(_start(dev, agent, "Hi!", thread_id=thread, user="li")["run_id"])
    assert second.answer == "Hello again." and "You serve Li Lei. Tier: 3." in script.prompts[3][0].content
    assert [m.content for m in script.prompts[3] if m.type == "human"] == ["My name is Li Lei.", "Hi!"]
    assert VariableValue.objects.get(name="tier").scope_key == "li"


def test_a_team_hands_a_task_to_its_member_which_uses_its_own_tool(dev, word_count, script):
    member = _agent(dev, name="counter", tools=[word_count["id"]], system_prompt="You count words.")
    team = _agent(dev, name="lead", template="team", sub_agents=[member["id"]])
    script.extend([call("ask_counter", task="Count 'x y'"),
                   call("word_count", text="x y"), "2", "'x y' has 2 words.",   # the member, then its answer
                   "Done.", "The counter says: 2 words."])

    run = run_inline(_start(dev, team, "How many words in 'x y'?")["run_id"])

    assert (run.status, run.answer) == (RunStatus.DONE, "The counter says: 2 words.")
    assert "ask_counter(task=\"Count 'x y'\") returned: 'x y' has 2 words." in script.prompts[-1][-1].content
    assert [name for kind, name in _steps(run.public_id) if kind == "tool"] == ["word_count", "ask_counter"]
    assert "You count words." in script.prompts[1][0].content


def test_bad_settings_and_bad_requests_are_4xx_naming_the_problem(dev, word_count, script):
    bad = [({"model": "nope"}, "No deployment named 'nope'"), ({"tools": [9999]}, "no tool 9999"),
           ({"tool_strategy": "telepathy"}, "tool_strategy"), ({"limits": {"max_steps": 0}}, "limits.max_steps"),
           ({"variables": [{"name": "1x"}]}, "variables[0]"), ({"sub_agents": [1]}, "Only a team"),
           ({"colour": "red"}, "Unknown settings: colour")]
    for settings, message in bad:
        response = dev.post(AGENTS, {"name": "bad", "template": "tool_calling",
                                     "settings": {"model": MODEL} | settings},
                            format="json")
        assert response.status_code == 400 and message in response.json()["error"]["message"], settings
    team = dev.post(AGENTS, {"name": "t", "template": "team", "settings": {"model": MODEL}}, format="json")
    assert team.status_code == 400 and "at least one sub-agent" in team.json()["error"]["message"]

    agent = _agent(dev)
    assert dev.post(f"{AGENTS}{agent['id']}/runs/", {"input": "  "}, format="json").status_code == 400
    unknown = dev.post(f"{AGENTS}{agent['id']}/runs/", {"input": "hi", "thread_id": "not-a-uuid"}, format="json")
    assert unknown.status_code == 404
    first = _start(dev, agent, "hi")
    busy = dev.post(f"{AGENTS}{agent['id']}/runs/", {"input": "again", "thread_id": first["thread_id"]},
                    format="json")
    assert busy.status_code == 409 and "still busy" in busy.json()["error"]["message"]


def test_a_deleted_tool_still_bound_ends_the_run_with_a_clear_error(dev, word_count, script):
    agent = _agent(dev, tools=[word_count["id"]])
    dev.delete(f"/api/workbridge/tools/{word_count['id']}/")

    run = run_inline(_start(dev, agent, "Count.")["run_id"])

    assert run.status == RunStatus.FAILED and "no longer exist" in run.error


def test_cancel_stops_a_queued_run_and_a_finished_run_cannot_be_cancelled(dev, script):
    agent = _agent(dev)
    queued = _start(dev, agent, "hi")
    cancelled = dev.post(f"{AGENTS}runs/{queued['run_id']}/cancel/")
    assert cancelled.json()["status"] == "cancelled"
    assert run_inline(queued["run_id"]).status == RunStatus.CANCELLED  # a late delivery does nothing

    script.append("Hello.")
    done = run_inline(_start(dev, agent, "hi")["run_id"])
    again = dev.post(f"{AGENTS}runs/{done.public_id}/cancel/")
    assert again.status_code == 409


def test_a_running_run_stops_at_its_next_step_once_cancelled(dev, word_count, script):
    agent = _agent(dev, tools=[word_count["id"]])
    started = _start(dev, agent, "Count.")

    def cancel_meanwhile(messages):
        AgentRun.objects.filter(public_id=started["run_id"]).update(cancel_requested=True)
        return call("word_count", text="a")

    script.extend([cancel_meanwhile, "never reached"])
    run = run_inline(started["run_id"])

    assert run.status == RunStatus.CANCELLED and not Invocation.objects.exists()


def test_the_events_stream_replays_a_finished_run(dev, script):
    agent = _agent(dev)
    script.append("Hello there.")
    run = run_inline(_start(dev, agent, "hi")["run_id"])

    body = b"".join(dev.get(f"{AGENTS}runs/{run.public_id}/events/")).decode()

    events = [line[len("event: "):] for line in body.splitlines() if line.startswith("event: ")]
    assert events == ["status", "status", "step", "step", "done"]
    assert '"answer": "Hello there."' in body.split("event: done")[1]


def test_another_workspace_cannot_see_run_or_change_an_agent(dev, script, make_workspace, key_client):
    agent = _agent(dev)
    script.append("Hello.")
    run = run_inline(_start(dev, agent, "hi")["run_id"])
    stranger = key_client("zed", make_workspace("Other", owner="zed"))

    assert stranger.get(AGENTS).json()["results"] == []
    for response in (stranger.get(f"{AGENTS}{agent['id']}/"), stranger.get(f"{AGENTS}runs/{run.public_id}/"),
                     stranger.post(f"{AGENTS}{agent['id']}/runs/", {"input": "hi"}, format="json"),
                     stranger.post(f"{AGENTS}runs/{run.public_id}/cancel/"),
                     stranger.get(f"{AGENTS}threads/{run.thread.public_id}/variables/"),
                     stranger.delete(f"{AGENTS}{agent['id']}/")):
        assert response.status_code == 404
    viewer = Client()
    viewer.login(username="viewer", password="correct-horse-battery")
    assert viewer.get(f"{AGENTS}runs/{run.public_id}/").status_code == 200
    assert viewer.post(f"{AGENTS}{agent['id']}/runs/", {"input": "hi"},
                       content_type="application/json").status_code == 403


def test_every_save_that_changes_the_settings_is_a_version(dev):
    agent = _agent(dev)
    same = dev.put(f"{AGENTS}{agent['id']}/", {"name": "helper", "template": "tool_calling",
                                                 "settings": {"model": MODEL}}, format="json").json()
    changed = dev.put(f"{AGENTS}{agent['id']}/", {"name": "helper", "template": "tool_calling",
                                                    "settings": {"model": MODEL, "system_prompt": "Be terse."}},
                      format="json").json()
    versions = dev.get(f"{AGENTS}{agent['id']}/versions/").json()
    assert (agent["version"], same["version"], changed["version"]) == (1, 1, 2)
    assert [v["number"] for v in versions] == [2, 1] and versions[0]["settings"]["system_prompt"] == "Be terse."
    assert json.dumps(versions[1]["settings"]["limits"]) == json.dumps(
        {"max_steps": 12, "max_tool_calls": 8, "timeout_s": 180, "max_tokens": 512})


def test_a_run_without_tool_calls_budget_gets_no_tools(dev, word_count, script):
    agent = _agent(dev, tools=[word_count["id"]], limits={"max_tool_calls": 0})
    script.append(AIMessage(content="I answer without tools."))
    run = run_inline(_start(dev, agent, "Count.")["run_id"])
    assert run.status == RunStatus.DONE and run.tool_calls == 0


def test_a_plan_step_that_names_a_tool_is_offered_only_that_tool(dev, word_count, script):
    echo = dev.post("/api/workbridge/tools/", {
        "name": "echo_text", "description": "Repeat a text.", "binding": "python",
        "parameters": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        "config": {"code": "def run(args):\n    return args['text']\n"}}, format="json").json()
    agent = _agent(dev, name="steps", template="plan_execute", tools=[word_count["id"], echo["id"]],
                   tool_strategy="json", planning={"approval": "auto"})
    script.extend(['{"steps": ["Count the words of \'a b\' with the word_count tool"]}',
                   '{"tool": "word_count", "arguments": {"text": "a b"}}', '{"final": "2"}', "Two words."])

    run = run_inline(_start(dev, agent, "Count 'a b'.")["run_id"])

    assert run.status == RunStatus.DONE
    step_prompt = script.prompts[1][0].content
    assert "- word_count:" in step_prompt and "echo_text" not in step_prompt
