"""Python tools: `def run(args)` run under bubblewrap, with no network and no view of the platform, within limits
that hostile code cannot outlast; every way it can go wrong is a failed invocation with the reason, never a 500 or a
hung worker."""

import time
from pathlib import Path

import pytest

from workbridge import sandbox
from workbridge.models import Invocation

pytestmark = pytest.mark.django_db
TOOLS = "/api/workbridge/tools/"


@pytest.fixture
def acme(make_workspace):
    return make_workspace("Acme", owner="ann", dev="developer")


@pytest.fixture
def dev(acme, key_client):
    return key_client("dev", acme)


def _python_tool(dev, code: str, *, name: str = "calc", timeout_s: float = 5, cap: int = 1_048_576,
                 parameters: dict | None = None) -> dict:
    response = dev.post(TOOLS, {"name": name, "description": "Runs code.", "binding": "python",
                                "parameters": parameters or {"type": "object"}, "config": {"code": code},
                                "timeout_s": timeout_s, "max_output_bytes": cap}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _call(dev, tool: dict, arguments: dict | None = None) -> dict:
    response = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": arguments or {}}, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def test_a_python_tool_gets_its_arguments_and_its_answer_is_recorded(dev):
    tool = _python_tool(dev, "def run(args):\n    print('working')\n    return {'total': sum(args['prices'])}\n",
                        parameters={"type": "object", "required": ["prices"],
                                    "properties": {"prices": {"type": "array", "items": {"type": "number"}}}})

    called = _call(dev, tool, {"prices": [1.5, 2.5, 38]})

    assert called["output"] == {"total": 42.0} and called["invocation"]["status"] == "ok"
    assert called["request"]["stdout"] == "working\n" and called["request"]["sandbox"] == "bwrap"
    assert Invocation.objects.get().result_excerpt == '{"total": 42.0}'


@pytest.mark.parametrize("code, reason", [
    ("def run(args):\n    import socket\n    socket.create_connection(('93.184.216.34', 80), timeout=3)\n",
     "Network is unreachable"),
    ("def run(args):\n    return open('/etc/hostname').read()\n", "No such file or directory"),
    ("def run(args):\n    import os\n    return str(sorted(os.environ))\n", None),
    ("def run(args):\n    open('/usr/evil', 'w')\n", "Read-only file system"),
])
def test_the_code_sees_no_network_no_files_and_no_environment_of_the_platform(dev, code, reason, settings):
    called = _call(dev, _python_tool(dev, code))
    if reason is None:
        assert called["output"] == "['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE']"
    else:
        assert called["invocation"]["status"] == "failed" and reason in called["invocation"]["error"]


@pytest.mark.parametrize("code, timeout_s, reason", [
    ("def run(args):\n    while True:\n        pass\n", 1, "ran longer than its timeout of 1 s"),
    ("def run(args):\n    import time\n    time.sleep(60)\n", 1, "ran longer than its timeout of 1 s"),
    ("def run(args):\n    import os\n    while True:\n        os.fork()\n", 5, "at most 32 processes"),
    ("def run(args):\n    blocks = []\n    while True:\n        blocks.append(bytearray(2**26))\n", 5,
     "ran out of memory"),
    ("def run(args):\n    with open('big', 'wb') as f:\n        f.write(b'x' * 2**27)\n", 5, "File too large"),
    ("def run(args):\n    return 'x' * 100_000_000\n", 5, "larger than the tool's output cap"),
    ("def run(args):\n    return [1, 2]\n", 5, "must return a dict or a str, not list"),
    ("def run(args):\n    return {'when': object()}\n", 5, "not JSON"),
    ("def run(args):\n    raise KeyError('sku')\n", 5, "KeyError: 'sku'"),
    ("def run(args):\n    import os\n    os.setsid()\n    if os.fork() == 0:\n        import time\n"
     "        time.sleep(60)\n    import time\n    time.sleep(60)\n", 1, "ran longer than its timeout"),
])
def test_hostile_or_broken_code_is_a_failed_invocation_with_the_reason_and_leaves_nothing_running(
        dev, code, timeout_s, reason):
    tool = _python_tool(dev, code, timeout_s=timeout_s, cap=1_048_576)
    started = time.monotonic()

    called = _call(dev, tool)

    assert called["invocation"]["status"] == "failed", called
    assert reason in called["invocation"]["error"]
    assert time.monotonic() - started < timeout_s + 5
    assert _sandbox_processes() == []


def _sandbox_processes() -> list[str]:
    """Command lines of live sandbox runners, from /proc."""
    running = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if sandbox.RUNNER.encode() in words:
            running.append(cmdline.parent.name)
    return running


def test_endless_printing_is_cut_and_the_call_still_ends(dev):
    called = _call(dev, _python_tool(dev, "def run(args):\n    while True:\n        print('y' * 1000)\n",
                                     timeout_s=1))
    assert called["invocation"]["status"] == "failed"
    assert called["request"]["stdout"].endswith("… (cut)") and len(called["request"]["stdout"]) < 70_000


@pytest.mark.parametrize("code, message", [
    ("def run(args) return 1", "does not compile"),
    ("def helper():\n    return 1\n", "must define a function run(args)"),
    ("", "holds its code"),
])
def test_code_that_cannot_run_is_refused_when_saved(dev, code, message):
    response = dev.post(TOOLS, {"name": "bad", "description": "x", "binding": "python", "parameters": {},
                                "config": {"code": code}}, format="json")
    assert response.status_code == 400 and message in response.json()["error"]["message"]


def test_without_bubblewrap_python_tools_are_refused_unless_the_operator_allows_the_unsafe_mode(
        dev, monkeypatch, settings):
    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-not-installed")
    sandbox._bwrap_works.cache_clear()
    try:
        refused = dev.post(TOOLS, {"name": "calc", "description": "x", "binding": "python", "parameters": {},
                                   "config": {"code": "def run(args):\n    return 'hi'\n"}}, format="json")
        settings.SANDBOX_MODE = "unsafe-dev"
        tool = _python_tool(dev, "def run(args):\n    return 'hi'\n")
        called = _call(dev, tool)
    finally:
        sandbox._bwrap_works.cache_clear()

    assert refused.status_code == 400 and "need bubblewrap" in refused.json()["error"]["message"]
    assert called["output"] == "hi" and called["request"]["sandbox"] == "unsafe-dev"
