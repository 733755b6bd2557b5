"""Issue 30, item 4: a secret a remote service echoes back never leaves in output. The tool sends the workspace's
secret; the service answers with it as typed, as a Bearer header, base64- and URL-encoded, and with a second,
three-character secret of the workspace. Every place the answer reaches shows the mask instead: the agent run's
steps, its event stream, the app's trace page, the evaluation report and its export (the invoke API is in
tests/workbridge/test_tools.py, /mcp in tests/workbridge/test_mcp.py; bundles carry no tool output nor secret).
The model's replies are scripted; the tool, the service, the run, the evaluation and the pages are real."""

import base64
import json
import uuid
from urllib.parse import quote

import pytest
from django.test import Client

from accounts.services import Actor
from agent_studio import evaluation
from agent_studio.models import AgentRun
from runtime import services as runtime_services
from runtime.models import Channel, Trace
from tests.agent_studio.conftest import AGENTS, MODEL, call, run_inline
from tests.conftest import JsonService, local_http_server

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "tok-Echoed+Secret/42=="
SHORT = "k9!"
LEAKS = [TOKEN, base64.b64encode(TOKEN.encode()).decode(), quote(TOKEN, safe=""), SHORT]


class Echoing(JsonService):
    """What a careless service does: repeats the credential it was sent, in every spelling."""

    def answer(self) -> dict:
        auth = self.headers.get("Authorization", "")
        sent = auth.removeprefix("Bearer ")
        return {"headers": {"Authorization": auth}, "b64": base64.b64encode(sent.encode()).decode(),
                "url": f"/echo?token={quote(sent, safe='')}", "note": f"pin {SHORT} accepted"}


@pytest.fixture
def echo_tool(dev, acme, settings):
    settings.EGRESS_ALLOW = ["127.0.0.1/32"]
    with local_http_server(Echoing) as port:
        for name, value in (("ECHO_TOKEN", TOKEN), ("PIN", SHORT)):
            assert dev.post("/api/workbridge/secrets/", {"name": name, "value": value},
                            format="json").status_code == 201
        tool = dev.post("/api/workbridge/tools/", {
            "name": "echo_headers", "description": "Show the headers the service received.",
            "parameters": {"type": "object", "properties": {}},
            "config": {"method": "GET", "url": f"http://127.0.0.1:{port}/headers",
                       "auth": {"type": "bearer", "secret": "ECHO_TOKEN"}}}, format="json").json()
        yield tool


def _no_leak(text: str, where: str) -> None:
    leaked = [form for form in LEAKS if form in text]
    assert not leaked, f"{where} shows {leaked}"
    assert "••••••••" in text, f"{where} does not show the tool's answer at all"


@pytest.fixture
def agent(dev, echo_tool):
    response = dev.post(AGENTS, {"name": "echoer", "template": "tool_calling",
                                 "settings": {"model": MODEL, "tools": [echo_tool["id"]]}}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _answers(script, count: int = 3) -> None:
    """A call of the tool, then plain answers (the run's own reply and its respond step, whichever it asks)."""
    script.extend([call("echo_headers"), *["The service answered."] * (count - 1)])


def test_an_agent_runs_steps_and_event_stream_show_the_secret_masked(dev, agent, script):
    _answers(script)
    started = dev.post(f"{AGENTS}{agent['id']}/runs/", {"input": "What does the service see?"}, format="json")
    run = run_inline(started.json()["run_id"])

    _no_leak(json.dumps(dev.get(f"{AGENTS}runs/{run.public_id}/").json(), ensure_ascii=False), "the run's steps")
    events = b"".join(dev.get(f"{AGENTS}runs/{run.public_id}/events/")).decode()
    _no_leak(json.loads(f'"{events}"') if "\\u" in events else events, "the run's events")


def test_an_agent_apps_trace_page_shows_the_secret_masked(dev, agent, script, acme):
    _answers(script)
    started = dev.post(f"{AGENTS}{agent['id']}/runs/", {"input": "What does the service see?"}, format="json")
    run = run_inline(started.json()["run_id"])
    owner = acme.memberships.get(role="owner").user
    app = runtime_services.publish_app(actor=Actor(user=owner), agent=AgentRun.objects.get(pk=run.pk).agent,
                                       slug="echo-app")
    trace = Trace.objects.create(app=app, release=app.current_release, channel=Channel.CHAT, public_id=uuid.uuid4(),
                                 query=run.input, answer=run.answer, agent_run=run)
    page = Client()
    page.login(username="ann", password="correct-horse-battery")
    _no_leak(page.get(f"/apps/{app.slug}/logs/{trace.public_id}/").content.decode(), "the app's trace page")


def test_an_evaluation_report_and_its_export_show_the_secret_masked(dev, agent, script):
    assert dev.post(f"{AGENTS}{agent['id']}/scenarios/", {
        "name": "echo", "input": "What does the service see?", "checks": [{"kind": "contains", "value": "answered"}],
        "expected_tools": [{"name": "echo_headers"}]}, format="json").status_code == 201
    _answers(script)
    started = dev.post(f"{AGENTS}{agent['id']}/evaluations/", {"include_safety": False}, format="json")
    evaluation.run(started.json()["id"])

    report = dev.get(f"{AGENTS}evaluations/{started.json()['id']}/").json()
    assert report["status"] == "done", report["error"]
    exported = dev.get(f"{AGENTS}evaluations/{started.json()['id']}/export/").content.decode()
    for text, where in ((json.dumps(report, ensure_ascii=False), "the report"), (exported, "the export")):
        assert not [form for form in LEAKS if form in text], f"{where} shows the secret"
