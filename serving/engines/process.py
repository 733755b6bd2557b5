"""Engine replicas are OS processes that outlive the Celery task that starts them. A short-lived launcher starts
each one in its own session and exits, so the replica belongs to no worker and survives worker restarts.

Only the PID is stored with a replica, and PIDs are reused: after a reboot, or once the engine is long gone, the
stored number may belong to any process. So `launch` records each engine's start time (psutil's create_time,
which differs for any other process holding the number later) beside the engine logs, and `terminate` signals a
process only when it is still the one that was launched.
"""

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
from django.conf import settings

# The engine is pinned to its CPUs before it execs, so that every thread it starts inherits them.
LAUNCHER = (
    "import json, os, subprocess, sys\n"
    "argv, log, env, cpus = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])\n"
    "pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None\n"
    "process = subprocess.Popen(argv, stdout=open(log, 'ab'), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,\n"
    "                           start_new_session=True, env=env, preexec_fn=pin)\n"
    "print(process.pid)\n"
)


class EngineStartFailed(RuntimeError):
    pass


def bind_address(address: str) -> str:
    """The IP address an engine binds for a node's advertised address (a name is resolved once, here)."""
    try:
        return socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        raise EngineStartFailed(f"This node's address '{address}' (FACTORY_NODE_ADDRESS) does not resolve: {exc}")


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def write_key_file(path: Path, key: str) -> Path:
    """The replica's key in a file only this user can read, for the engine's --api-key-file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(key + "\n")
    partial.replace(path)
    return path


def launch(argv: list[str], *, log_path: Path, env: dict[str, str | None] | None = None,
           cpus: tuple[int, ...] = ()) -> int:
    """Start the engine in a session of its own, pinned to `cpus` (none: wherever the scheduler puts it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {name: value for name, value in {**os.environ, **(env or {})}.items() if value is not None}
    done = subprocess.run([sys.executable, "-c", LAUNCHER, json.dumps(argv), str(log_path), json.dumps(full_env),
                           json.dumps(list(cpus))], capture_output=True, text=True, timeout=60, check=True)
    pid = int(done.stdout.strip())
    started = _start_time(pid)
    if started is not None:
        _launched_dir().mkdir(parents=True, exist_ok=True)
        (_launched_dir() / str(pid)).write_text(repr(started))
    return pid


def _launched_dir() -> Path:
    return Path(settings.DATA_DIR) / "engines" / "launched"


@contextmanager
def core_assignment() -> Iterator[list[set[int]]]:
    """Held while a replica's cores are chosen and its engine launched: the CPUs of every engine launched from this
    data dir that still runs. Two starts on one node (make run starts both presets at once) take turns here, so
    the second sees the first's cores."""
    _launched_dir().mkdir(parents=True, exist_ok=True)
    with open(_launched_dir().parent / "cores.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield [cpus for cpus in map(_cpus_of, _launched_pids()) if cpus]


def _cpus_of(pid: int) -> set[int]:
    try:
        return set(psutil.Process(pid).cpu_affinity())
    except psutil.Error:  # it ended meanwhile
        return set()


def _launched_pids() -> list[int]:
    pids = []
    for record in sorted(_launched_dir().glob("[0-9]*")):
        pid = int(record.name)
        if is_alive(pid) and launched_here(pid):
            pids.append(pid)
    return pids


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def launched_here(pid: int | None) -> bool:
    """True when `pid` is still the process `launch` started under that number."""
    if not pid:
        return False
    try:
        recorded = float((_launched_dir() / str(pid)).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return _start_time(pid) == recorded


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
    """Stop the engine's whole process group, if `pid` is still the engine `launch` started (see the module's
    docstring): a stale PID is left alone."""
    if not is_alive(pid) or not launched_here(pid):
        if pid:
            (_launched_dir() / str(pid)).unlink(missing_ok=True)
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
    (_launched_dir() / str(pid)).unlink(missing_ok=True)


def terminate_launched() -> list[int]:
    """Stop every engine `launch` started from this data dir that still runs, whatever the database says of it
    (`make stop` needs neither the database nor a readable secret): the PIDs of those stopped."""
    stopped = _launched_pids()
    for pid in stopped:
        terminate(pid)
    for record in _launched_dir().glob("[0-9]*"):
        record.unlink(missing_ok=True)
    return stopped


def log_tail(log_path: Path | None, lines: int = 15) -> str:
    """The last lines of an engine's log; '' for an engine without one (an external endpoint)."""
    if log_path is None:
        return ""
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
