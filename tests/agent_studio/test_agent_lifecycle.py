"""An agent from its template to its deletion: the templates it can be made from, its evaluation page and report
showing every kind of check and expectation a scenario has, and deletion, which keeps or deletes its runs as the
user chooses and is refused while a published app pins it. The model's replies are scripted."""

import pytest
from django.test import Client
from django.utils.html import escape

from accounts.models import AuditEntry
from agent_studio import demo, evaluation, memory, services
from agent_studio.models import Agent, AgentEvalRun, AgentRun, AgentTemplate, AgentThread, MemoryItem, RunStep
from agent_studio.runs.fields import EvalStatus
from agent_studio.templatetags.scenarios import CHECKS
from cluster import queues
from runtime import services as runtime_services
from tests.agent_studio.conftest import AGENTS, MODEL, call, run_inline
from tests.agent_studio.test_runs import _agent, _start
from tests.conftest import UNREAD_QUEUE

pytestmark = pytest.mark.django_db(transaction=True)


def _signed_in(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password="correct-horse-battery")
    return client


def test_the_templates_are_listed_with_what_they_do_and_the_settings_they_take(acme, key_client, make_workspace):
    listed = _signed_in("viewer").get(f"{AGENTS}templates/")

    assert listed.status_code == 200
    templates = {item["template"]: item for item in listed.json()}
    assert list(templates) == AgentTemplate.values
    for item in templates.values():
        settings = {setting["name"]: setting for setting in item["settings"]}
        assert item["label"] and item["description"] and all(s["description"] for s in settings.values())
        assert settings["model"]["required"] and settings["model"]["default"] is None
        assert settings["limits"]["default"] == {"max_steps": 12, "max_tool_calls": 8, "timeout_s": 180,
                                                 "max_tokens": 512}
    names = {template: {s["name"]: s["required"] for s in item["settings"]} for template, item in templates.items()}
    assert names["team"]["sub_agents"] and "sub_agents" not in names["tool_calling"]
    assert "planning" in names["plan_execute"] and "planning" not in names["tool_calling"]
    other = key_client("zed", make_workspace("Other", owner="zed")).get(f"{AGENTS}templates/")
    assert other.json() == listed.json()


def test_the_evaluation_page_describes_every_check_kind_and_expectation(dev, acme, ann):
    agent = Agent.objects.get(pk=_agent(dev)["id"])
    kinds = sorted(services.SCENARIO_CHECK_KINDS)
    for kind in kinds:
        services.save_scenario(actor=ann, agent=agent, name=f"checks {kind}", input="Say something.",
                               checks=[{"kind": kind, "value": f"value of {kind}", "path": f"reply.{kind}"}])
    services.save_scenario(
        actor=ann, agent=agent, name="expects tools and memory", input="Count 'a b'.",
        expected_tools=[{"name": "word_count", "arguments": {"text": "a b"}}, {"name": "notify"}],
        tools_in_order=True, forbidden_tools=["delete_all"], expected_memory=[{"name": "tier", "value": 3},
                                                                               {"name": "seen"}],
        history=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])
    page = _signed_in("dev")

    shown = page.get(f"/agents/{agent.pk}/evaluation/")

    assert shown.status_code == 200
    html = shown.content.decode()
    for kind in kinds:
        phrase = CHECKS[kind] % {"value": f"value of {kind}", "path": f"reply.{kind}"}
        assert f'<code data-check="{kind}">{escape(phrase)}</code>' in html, kind
    for expected in ('word_count(text=&quot;a b&quot;)', "notify()", "(in order)", "delete_all", "tier = 3",
                     "<code>seen</code>", "(after 2 earlier turns)"):
        assert expected in html, expected

    demo_agent = demo.create_demo_agent(actor=ann, workspace=acme, model=MODEL)
    assert page.get(f"/agents/{demo_agent.pk}/evaluation/").status_code == 200


def test_the_evaluation_report_renders_running_and_with_every_check_kind(dev, ann):
    agent = Agent.objects.get(pk=_agent(dev)["id"])
    version = agent.versions.first()
    checks = [{"kind": kind, "value": f"value of {kind}", "path": f"reply.{kind}"}
              for kind in sorted(services.SCENARIO_CHECK_KINDS)]
    running = AgentEvalRun.objects.create(agent=agent, version=version, status=EvalStatus.RUNNING, total=1)
    done = AgentEvalRun.objects.create(agent=agent, version=version, status=EvalStatus.DONE, results=[{
        "type": "scenario", "name": "every check", "run_id": "r", "status": "done", "answer": "value of contains",
        "error": "", "success": False, "checks": [{"check": check, "passed": False} for check in checks],
        "tool_correctness": 1.0, "tools_called": [], "forbidden_called": [], "memory_ok": True, "latency_ms": 5.0,
        "steps": 1, "model_calls": 1, "tool_calls": 0, "tokens": 3}])
    page = _signed_in("dev")

    assert page.get(f"/agents/evaluations/{running.pk}/").status_code == 200
    report = page.get(f"/agents/evaluations/{done.pk}/")
    assert report.status_code == 200
    for check in checks:
        assert escape(CHECKS[check["kind"]] % check) in report.content.decode(), check["kind"]


def _ran(dev, script, word_count) -> tuple[Agent, AgentRun]:
    """An agent that has run once (a tool call, then the answer) and remembers something, never published."""
    agent = Agent.objects.get(pk=_agent(dev, tools=[word_count["id"]])["id"])
    script.extend([call("word_count", text="a b"), "2", "Two words."])
    run = run_inline(_start(dev, {"id": agent.pk}, "Count 'a b'.")["run_id"])
    assert run.answer == "Two words."
    MemoryItem.objects.create(namespace="\x1f".join(memory.memory_namespace(agent.pk, "li")), key="k",
                              value={"text": "Li likes tea."})
    return agent, run


def _checkpointed(thread: AgentThread) -> bool:
    return memory.checkpointer().get_tuple({"configurable": {"thread_id": memory.thread_key(thread)}}) is not None


def test_an_agent_that_ran_is_deleted_with_its_runs_kept(dev, script, word_count):
    agent, run = _ran(dev, script, word_count)
    assert _checkpointed(run.thread)

    unsaid = dev.delete(f"{AGENTS}{agent.pk}/")
    assert unsaid.status_code == 400 and "'keep' or 'delete'" in unsaid.json()["error"]["message"]
    deleted = dev.delete(f"{AGENTS}{agent.pk}/?runs=keep")

    assert deleted.status_code == 204 and not Agent.objects.exists() and not AgentThread.objects.exists()
    kept = dev.get(f"{AGENTS}runs/{run.public_id}/").json()
    assert (kept["agent"], kept["version"], kept["thread_id"], kept["answer"]) == ("helper", None, None,
                                                                                    "Two words.")
    assert [step["kind"] for step in kept["steps"]] == ["model", "tool", "model", "model", "answer"]
    assert [item["run_id"] for item in dev.get(f"{AGENTS}runs/").json()["results"]] == [str(run.public_id)]
    assert not MemoryItem.objects.exists() and not _checkpointed(run.thread)
    assert AuditEntry.objects.get(action="agent.delete").detail == {"name": "helper", "runs": "keep"}


def test_an_agent_that_ran_is_deleted_with_its_runs_and_evaluations(dev, ann, script, word_count):
    agent, run = _ran(dev, script, word_count)
    services.save_scenario(actor=ann, agent=agent, name="greets", input="Hi")
    started = services.start_evaluation(actor=ann, agent=agent, include_safety=False)
    script.append("Hello.")
    evaluation.run(started.pk)
    assert AgentRun.objects.count() == 2

    deleted = dev.delete(f"{AGENTS}{agent.pk}/?runs=delete")

    assert deleted.status_code == 204
    assert not (Agent.objects.exists() or AgentRun.objects.exists() or RunStep.objects.exists()
                or AgentEvalRun.objects.exists())
    assert dev.get(f"{AGENTS}runs/{run.public_id}/").status_code == 404


def test_a_published_agent_is_refused_until_its_app_is_deleted(dev, ann, script, word_count):
    agent, run = _ran(dev, script, word_count)
    app = runtime_services.publish_app(actor=ann, agent=agent, slug="counter")

    refused = dev.delete(f"{AGENTS}{agent.pk}/?runs=delete")
    assert refused.status_code == 409 and "published as an app" in refused.json()["error"]["message"]
    assert Agent.objects.filter(pk=agent.pk).exists() and AgentRun.objects.filter(pk=run.pk).exists()
    assert not AuditEntry.objects.filter(action="agent.delete").exists() and _checkpointed(run.thread)

    page = _signed_in("dev")
    confirm = page.get(f"/agents/{agent.pk}/").content.decode()
    assert 'name="runs" value="keep" checked' in confirm and 'name="runs" value="delete"' in confirm
    runtime_services.delete_app(actor=ann, app=app)
    gone = page.post(f"/agents/{agent.pk}/delete/", {"runs": "keep"}, follow=True)
    assert gone.redirect_chain[-1][0] == "/agents/" and "its runs are kept" in gone.content.decode()
    assert not Agent.objects.exists() and AgentRun.objects.get().agent_name == "helper"


def test_an_agent_with_an_unfinished_run_is_not_deleted(dev):
    agent = _agent(dev)
    queued = _start(dev, agent, "hi")

    refused = dev.delete(f"{AGENTS}{agent['id']}/?runs=delete")

    assert refused.status_code == 409 and "1 unfinished run" in refused.json()["error"]["message"]
    assert dev.post(f"{AGENTS}runs/{queued['run_id']}/cancel/").status_code == 200
    assert dev.delete(f"{AGENTS}{agent['id']}/?runs=delete").status_code == 204


def test_a_queued_evaluation_is_cancelled_from_its_report_and_leaves_the_line(dev, ann, monkeypatch):
    monkeypatch.setattr(queues, "INTERACTIVE", UNREAD_QUEUE)
    queues.broker().delete(UNREAD_QUEUE)
    agent = Agent.objects.get(pk=_agent(dev)["id"])
    started = services.start_evaluation(actor=ann, agent=agent, include_safety=True)
    page = _signed_in("dev")
    report = page.get(f"/agents/evaluations/{started.pk}/").content.decode()
    assert 'value="cancel_evaluation"' in report and "#1 in line" in report

    page.post(f"/agents/evaluations/{started.pk}/", {"action": "cancel_evaluation", "id": started.pk})

    started.refresh_from_db()
    assert started.status == EvalStatus.CANCELLED and started.finished_at is not None
    assert queues.waiting(UNREAD_QUEUE) == []
    evaluation.run(started.pk)  # a message a worker had taken already: it runs nothing
    started.refresh_from_db()
    assert (started.status, started.results) == (EvalStatus.CANCELLED, [])
    assert dev.post(f"{AGENTS}evaluations/{started.pk}/cancel/").status_code == 409
