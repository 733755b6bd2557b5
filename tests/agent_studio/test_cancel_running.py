"""Cancel means cancelled within seconds, whatever the run is waiting on: a workflow run in a code node on a real
worker (its sandbox killed), a workflow run waiting on a model call or an HTTP node's server (its connection closed:
a gateway seeing its caller gone frees the engine's slot), and an agent run in a python tool's call. Each would
otherwise have run on for 25 s, or until the server answered, and ended done or failed."""

import threading
import time
from http.server import BaseHTTPRequestHandler

import psutil
import pytest

from agent_studio.models import AgentRun
from agent_studio.runs.fields import RunStatus
from agent_studio.workflows.models import WorkflowRun
from tests.agent_studio.conftest import AGENTS, MODEL, call, run_inline
from tests.agent_studio.test_workflows import (
    WORKFLOWS,
    _answer,
    _chain,
    _graph,
    _save,
    run_inline as run_workflow_inline,
)
from tests.conftest import local_http_server, wait_for
from workbridge import sandbox

pytestmark = pytest.mark.django_db(transaction=True)
SLEEPS = "import time\n\ndef run(args):\n    time.sleep(25)\n    return 'woke up'\n"
CANCELLED_WITHIN_S = 5.0


def sandboxes(parent_pid: int) -> list[psutil.Process]:
    """The code sandboxes running under `parent_pid`: bubblewrap and the runner inside it."""
    found = []
    for process in psutil.Process(parent_pid).children(recursive=True):
        try:
            if sandbox.RUNNER in process.cmdline():
                found.append(process)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def _finished(model, run_id):
    run = model.objects.get(public_id=run_id)
    return run if run.finished else None


def _cancel_and_wait(client, url: str, model, run_id):
    """Cancel through the API; the run as it ended, and how long after the cancel it did."""
    cancelled_at = time.monotonic()
    assert client.post(url).status_code == 200
    run = wait_for(lambda: _finished(model, run_id), timeout=30, interval=0.1, what="the run to end")
    return run, time.monotonic() - cancelled_at


def _sleeping_workflow(dev) -> dict:
    return _save(dev, _graph([{"id": "nap", "kind": "code", "settings": {"code": SLEEPS, "timeout_s": 60}},
                              _answer("{{nap.output}}")], _chain("start", "nap", "reply"))).json()


@pytest.mark.worker
def test_a_workflow_run_cancelled_in_a_code_node_on_a_worker_ends_cancelled_and_its_sandbox_is_killed(
        dev, celery_worker_process):
    worker = celery_worker_process["process"].pid
    started = dev.post(f"{WORKFLOWS}{_sleeping_workflow(dev)['id']}/run/", {"inputs": {"question": "hi"}},
                       format="json").json()
    wait_for(lambda: sandboxes(worker), timeout=60, what="the worker to run the code node's sandbox")

    run, took_s = _cancel_and_wait(dev, f"{WORKFLOWS}runs/{started['run_id']}/cancel/", WorkflowRun,
                                   started["run_id"])

    assert (run.status, run.error) == (RunStatus.CANCELLED, "The run was cancelled."), run.error
    assert took_s < CANCELLED_WITHIN_S
    wait_for(lambda: not sandboxes(worker), timeout=1, what="the sandbox's processes to be gone")


class Hanging(BaseHTTPRequestHandler):
    """Takes a request and never answers it, as an engine busy writing a long answer or a slow API; notes when its
    caller hangs up."""

    asked = threading.Event()
    hung_up = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        Hanging.asked.set()
        while self.rfile.read(1):  # b"" once the caller closed the connection
            pass
        Hanging.hung_up.set()

    def log_message(self, *args) -> None:
        pass


# A node that waits on the server at `server`, by kind.
WAITING = {
    "model call": lambda server: {"id": "wait", "kind": "llm", "settings": {"model": MODEL, "prompt": "Hi"}},
    "http node": lambda server: {"id": "wait", "kind": "http", "settings": {
        "method": "POST", "url": f"{server}/slow", "body": "hi", "timeout_s": 60}},
}


@pytest.mark.parametrize("waiting", WAITING.values(), ids=WAITING.keys())
def test_a_workflow_run_cancelled_while_waiting_on_a_server_ends_cancelled_and_hangs_up(dev, settings, waiting):
    Hanging.asked.clear()
    Hanging.hung_up.clear()
    with local_http_server(Hanging) as port:
        server = f"http://127.0.0.1:{port}"
        settings.GATEWAY_URL, settings.EGRESS_ALLOW = f"{server}/v1", ["127.0.0.1/32"]
        workflow = _save(dev, _graph([waiting(server), _answer("Got: {{wait.output}}")],
                                     _chain("start", "wait", "reply")))
        started = dev.post(f"{WORKFLOWS}{workflow.json()['id']}/run/", {"inputs": {"question": "hi"}},
                           format="json").json()
        worker = threading.Thread(target=run_workflow_inline, args=[started["run_id"]])
        worker.start()
        assert Hanging.asked.wait(30)

        run, took_s = _cancel_and_wait(dev, f"{WORKFLOWS}runs/{started['run_id']}/cancel/", WorkflowRun,
                                       started["run_id"])
        worker.join(10)

        assert (run.status, run.error) == (RunStatus.CANCELLED, "The run was cancelled."), run.error
        assert took_s < CANCELLED_WITHIN_S
        assert Hanging.hung_up.wait(1)


def test_an_agent_run_cancelled_in_a_python_tool_call_ends_cancelled_and_its_sandbox_is_killed(dev, script):
    tool = dev.post("/api/workbridge/tools/", {
        "name": "nap", "description": "Sleep a while.", "binding": "python", "timeout_s": 60,
        "parameters": {"type": "object", "properties": {}}, "config": {"code": SLEEPS}}, format="json").json()
    agent = dev.post(AGENTS, {"name": "napper", "template": "tool_calling",
                              "settings": {"model": MODEL, "tools": [tool["id"]]}}, format="json").json()
    started = dev.post(f"{AGENTS}{agent['id']}/runs/", {"input": "Nap."}, format="json").json()
    script.extend([call("nap"), "never reached"])
    worker = threading.Thread(target=run_inline, args=[started["run_id"]])
    worker.start()
    me = psutil.Process().pid
    wait_for(lambda: sandboxes(me), timeout=30, what="the tool's sandbox")

    run, took_s = _cancel_and_wait(dev, f"{AGENTS}runs/{started['run_id']}/cancel/", AgentRun, started["run_id"])
    worker.join(10)

    assert (run.status, run.error) == (RunStatus.CANCELLED, "The run was cancelled."), run.error
    assert took_s < CANCELLED_WITHIN_S and list(script) == ["never reached"]
    wait_for(lambda: not sandboxes(me), timeout=1, what="the sandbox's processes to be gone")
