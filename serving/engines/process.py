"""Engine replicas are OS processes that outlive the Celery task that starts them. A short-lived launcher starts
each one in its own session and exits, so the replica belongs to no worker and survives worker restarts."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

LAUNCHER = (
    "import json, subprocess, sys\n"
    "argv, log, env = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])\n"
    "process = subprocess.Popen(argv, stdout=open(log, 'ab'), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,\n"
    "                           start_new_session=True, env=env)\n"
    "print(process.pid)\n"
)


class EngineStartFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(argv: list[str], *, log_path: Path, env: dict[str, str | None] | None = None) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {name: value for name, value in {**os.environ, **(env or {})}.items() if value is not None}
    done = subprocess.run([sys.executable, "-c", LAUNCHER, json.dumps(argv), str(log_path), json.dumps(full_env)],
                          capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout.strip())


def is_alive(pid: int | None) -> bool:
    """True while the process runs; a zombie (dead, not yet reaped) counts as dead."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def terminate(pid: int | None, *, grace_s: float = 10.0) -> None:
    if not is_alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_alive(pid):
        time.sleep(0.1)
    if is_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def log_tail(log_path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def wait_healthy(url: str, *, pid: int | None, log_path: Path | None, timeout_s: float,
                 headers: dict | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pid is not None and not is_alive(pid):
            raise EngineStartFailed(f"The engine exited while starting:\n{log_tail(log_path)}")
        if probe(url, headers=headers):
            return
        time.sleep(0.25)
    raise EngineStartFailed(f"The engine did not answer {url} within {timeout_s:.0f}s:\n{log_tail(log_path)}")


def probe(url: str, *, headers: dict | None = None, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False
