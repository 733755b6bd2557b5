"""Python tools run here: `def run(args: dict) -> dict | str`, in a process the platform can always stop.

Under bubblewrap (the default, `FACTORY_SANDBOX=bwrap`) the code runs with every namespace unshared (no network, its
own PIDs, no view of the platform's files): `/usr` and the Python installation read-only, an empty tmpfs home and
/tmp, a cleared environment, all capabilities dropped. Every run also gets rlimits (CPU seconds, address space, file
size, open files, processes) and a wall-clock deadline after which the whole sandbox is killed: bubblewrap's init is
the sandbox's PID 1, so killing it ends every process inside, even one that left the process group.

RLIMIT_NPROC does not bind root, and the platform often runs as root in a container; where a pids cgroup can be
made (cgroup v1 `pids` or v2), each run gets one with `pids.max`, so a fork bomb stops at the limit there too.

The code and arguments go in as JSON on stdin; the result comes back as JSON on a pipe of its own (its number is
the runner's argument), so that what the code prints cannot be mistaken for its answer.
stdout and stderr are kept, capped.

Without user namespaces, bubblewrap cannot start: python tools are then refused with the reason, unless an operator
sets `FACTORY_SANDBOX=unsafe-dev`, which runs the same runner with the rlimits and the deadline but no isolation.
No library does this (the `sandbox` packages on PyPI either exec in-process or need Docker); bubblewrap is the
isolation, this module only assembles its arguments and reads the pipes.
"""

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings

from accounts import cancellation

BWRAP = "bwrap"
UNSAFE_DEV = "unsafe-dev"
HOME = "/home/sandbox"
OUTPUT_CAP_BYTES = 64 * 1024  # stdout and stderr each, as shown to the user
SCRATCH_BYTES = 64 * 2**20  # each tmpfs, and the largest file the code may write

# Runs inside the sandbox, started with `python -I -c RUNNER <fd>`. It reads {"code", "args"} from stdin and writes
# {"output"} or {"error"} to the result pipe, fd <fd>.
RUNNER = r"""
import json, os, signal, sys, traceback
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file over the size limit is an OSError the code sees
result = os.fdopen(int(sys.argv[1]), "w", encoding="utf-8")
runner = os.getpid()
def answer(**reply):
    if os.getpid() != runner:  # a process the code forked: only the runner answers
        os._exit(1)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    result.write(json.dumps(reply, ensure_ascii=False))
    result.flush()
    os._exit(0)
request = json.load(sys.stdin)
scope = {"__name__": "tool"}
try:
    exec(compile(request["code"], "tool.py", "exec"), scope)
    run = scope.get("run")
    if not callable(run):
        answer(error="The code defines no function run(args).")
    output = run(request["args"])
    if not isinstance(output, (dict, str)):
        answer(error=f"run() must return a dict or a str, not {type(output).__name__}.")
    try:
        json.dumps(output)
    except (TypeError, ValueError) as exc:
        answer(error=f"run() returned something that is not JSON: {exc}")
    answer(output=output)
except MemoryError:
    answer(error="MemoryError: the code ran out of memory.")
except BaseException:
    kind, value, tb = sys.exc_info()
    frames = [frame for frame in traceback.extract_tb(tb) if frame.filename == "tool.py"]
    lines = traceback.format_list(frames) + traceback.format_exception_only(kind, value)
    answer(error="Traceback (most recent call last):\n" + "".join(lines).rstrip())
"""


class SandboxUnavailable(Exception):
    pass


class SandboxCodeInvalid(ValueError):
    pass


@dataclass(frozen=True)
class Limits:
    cpu_s: int
    memory_bytes: int
    processes: int
    file_bytes: int = SCRATCH_BYTES
    open_files: int = 64

    @classmethod
    def for_timeout(cls, timeout_s: float) -> "Limits":
        return cls(cpu_s=max(1, int(timeout_s + 0.999)), memory_bytes=settings.SANDBOX_MEMORY_MB * 2**20,
                   processes=settings.SANDBOX_PROCESSES)


@dataclass(frozen=True)
class RunResult:
    output: object = None
    error: str = ""
    stdout: str = ""
    stderr: str = ""
    elapsed_ms: float = 0.0


def mode() -> str:
    return UNSAFE_DEV if settings.SANDBOX_MODE == UNSAFE_DEV else BWRAP


def availability() -> tuple[bool, str]:
    """Whether python tools can run here, and if not, why (said to the user who tries to save one)."""
    if mode() == UNSAFE_DEV:
        return True, "FACTORY_SANDBOX=unsafe-dev: python tools run WITHOUT isolation (limits only)."
    return _bwrap_works()


@cache
def _bwrap_works() -> tuple[bool, str]:
    if shutil.which(BWRAP) is None:
        return False, ("Python tools need bubblewrap (Debian package 'bubblewrap'), which is not installed on this "
                       "machine; `make run` installs it.")
    probe = subprocess.run([BWRAP, *_isolation(), "--", "/bin/true" if Path("/bin/true").exists() else "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return False, (f"Python tools need user namespaces for their sandbox, and bubblewrap cannot make them here "
                       f"({probe.stderr.strip() or probe.returncode}). An operator may set FACTORY_SANDBOX=unsafe-dev "
                       f"to run them without isolation.")
    return True, "bubblewrap"


def check_code(code) -> None:
    """The code must compile and define a top-level `run`; it is not run here."""
    if not isinstance(code, str) or not code.strip():
        raise SandboxCodeInvalid("A python tool's config holds its code: {\"code\": \"def run(args): ...\"}.")
    try:
        tree = ast.parse(code, filename="tool.py")
    except SyntaxError as exc:
        raise SandboxCodeInvalid(f"The code does not compile: {exc.msg} (line {exc.lineno}).") from exc
    if not any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "run"
               for node in tree.body):
        raise SandboxCodeInvalid("The code must define a function run(args) at its top level.")


def _isolation() -> list[str]:
    """bubblewrap's arguments for an empty, network-less world with the system and Python read-only."""
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
            "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp", "--size", str(SCRATCH_BYTES), "--tmpfs", HOME,
            "--chdir", HOME, "--setenv", "HOME", HOME, "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for prefix in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), sys.prefix}):
        if not prefix.startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
    return args


# Who a confined long-running command runs as inside its user namespace: nobody, owning none of the platform's files.
NOBODY = "65534"


def confine(argv: list[str], *, read_only_paths: tuple[str, ...] = (), env: dict | None = None) -> list[str]:
    """A long-running command (a local MCP server) in the same isolation as python tools (no network, no view of
    the platform's files, capabilities dropped), as an unprivileged user, seeing `read_only_paths` read-only and only
    `env` of an environment. In `unsafe-dev` mode it runs as it is, with `env` alone. Raises SandboxUnavailable where
    bubblewrap cannot run."""
    if mode() == UNSAFE_DEV:
        return list(argv)
    available, reason = availability()
    if not available:
        raise SandboxUnavailable(reason)
    binds = [part for path in read_only_paths for part in ("--ro-bind", path, path)]
    variables = [part for name, value in (env or {}).items() for part in ("--setenv", name, value)]
    return [BWRAP, *_isolation(), "--unshare-user", "--uid", NOBODY, "--gid", NOBODY, *binds, *variables, "--",
            *argv]


def _command(result_fd: int) -> list[str]:
    python = [sys.executable, "-I", "-c", RUNNER, str(result_fd)]
    if mode() == UNSAFE_DEV:
        return python
    return [BWRAP, *_isolation(), "--", *python]


class _PidsCgroup:
    """A pids cgroup for one run, where the platform may make one; otherwise nothing (RLIMIT_NPROC then limits a
    non-root platform, and the PID namespace plus the deadline a root one)."""

    ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))

    def __init__(self, limit: int):
        self.path = None
        for root in self.ROOTS:
            if (root / "cgroup.procs").exists() and os.access(root, os.W_OK) and (
                    root.name == "pids" or "pids" in _read(root / "cgroup.subtree_control")):
                try:
                    path = root / "aifactory-sandbox" / uuid.uuid4().hex
                    path.mkdir(parents=True)
                    (path / "pids.max").write_text(str(limit))
                    self.path = path
                except OSError:
                    continue
                break

    def close(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            pids = _read(self.path / "cgroup.procs").split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.02)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _limited(command: list[str], limits: Limits, cgroup: _PidsCgroup) -> list[str]:
    """`command` under its rlimits and in its cgroup, both set before it starts. A shell and prlimit (util-linux)
    do this rather than a preexec_fn, which may deadlock a process with threads (the web workers have 32)."""
    rlimits = [f"--cpu={limits.cpu_s}", f"--as={limits.memory_bytes}", f"--fsize={limits.file_bytes}",
               f"--nofile={limits.open_files}", "--core=0"]
    if os.getuid() != 0:
        rlimits.append(f"--nproc={limits.processes}")
    procs = str(cgroup.path / "cgroup.procs") if cgroup.path else "/dev/null"
    return ["/bin/sh", "-c", 'echo $$ > "$1" || exit 126; shift; exec "$@"', "sh", procs,
            "prlimit", *rlimits, "--", *command]


class _CappedReader(threading.Thread):
    """Reads a pipe to its end, keeping the first `cap` bytes: a child that prints without end cannot block on a
    full pipe, nor fill the platform's memory."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap, self.kept, self.overflowed = stream, cap, bytearray(), False

    def run(self) -> None:
        with self.stream:
            while chunk := self.stream.read(65536):
                room = self.cap - len(self.kept)
                if len(chunk) > room:
                    self.overflowed = True
                self.kept += chunk[:max(room, 0)]

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace") + ("\n… (cut)" if self.overflowed else "")


def run_python(code: str, arguments: dict, *, timeout_s: float, max_output_bytes: int) -> RunResult:
    """Run `run(arguments)` in the sandbox. Whatever the code does (raise, loop, fork, fill memory or disk, print
    without end, return 100 MB) comes back as RunResult.error with the reason; this never raises for the code's
    sake, only SandboxUnavailable when no sandbox can run here."""
    available, reason = availability()
    if not available:
        raise SandboxUnavailable(reason)
    limits = Limits.for_timeout(timeout_s)
    cgroup = _PidsCgroup(limits.processes)
    result_read, result_write = os.pipe()
    # bubblewrap's own working directory is its empty home; the unsafe mode gets a scratch directory at least.
    scratch = tempfile.mkdtemp(prefix="aifactory-tool-")
    started = time.perf_counter()
    try:
        # pass_fds keeps the result pipe open across exec under the same number, and bubblewrap passes it on.
        process = subprocess.Popen(
            _limited(_command(result_write), limits, cgroup), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(result_write,), start_new_session=True,
            cwd=scratch, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})
    except OSError as exc:
        os.close(result_read)
        os.close(result_write)
        cgroup.close()
        shutil.rmtree(scratch, ignore_errors=True)
        raise SandboxUnavailable(f"The sandbox could not start: {exc}") from exc
    os.close(result_write)
    readers = {"stdout": _CappedReader(process.stdout, OUTPUT_CAP_BYTES),
               "stderr": _CappedReader(process.stderr, OUTPUT_CAP_BYTES),
               "result": _CappedReader(os.fdopen(result_read, "rb"), max_output_bytes + 64)}
    for reader in readers.values():
        reader.start()
    timed_out = False
    try:
        with cancellation.stopping(lambda: _stop_when_cancelled(process)):
            try:
                process.stdin.write(json.dumps({"code": code, "args": arguments}).encode())
                process.stdin.close()
            except BrokenPipeError:
                pass
            process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill(process)
        cgroup.close()
        for reader in readers.values():
            reader.join(timeout=5)
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed_ms = (time.perf_counter() - started) * 1000
    stdout, stderr = readers["stdout"].text(), readers["stderr"].text()
    error, output = _outcome(readers["result"], process.returncode, timed_out, timeout_s, limits,
                             max_output_bytes)
    if error and cancellation.cancelled():
        error = "The run was cancelled; its code was stopped."
    return RunResult(output=output, error=error, stdout=stdout, stderr=stderr, elapsed_ms=elapsed_ms)


def _kill(process: subprocess.Popen) -> None:
    """The whole sandbox: bubblewrap's process group (its init dies with it, and the PID namespace with that)."""
    _kill_group(process.pid)
    process.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _stop_when_cancelled(process: subprocess.Popen) -> None:
    """The run was cancelled (from another thread): the sandbox is killed now, unless its process was reaped
    meanwhile; then `_kill` cleans up as ever."""
    if process.returncode is None:
        _kill_group(process.pid)


def _outcome(result: _CappedReader, returncode: int, timed_out: bool, timeout_s: float, limits: Limits,
             max_output_bytes: int) -> tuple[str, object]:
    if timed_out:
        return f"The code ran longer than its timeout of {timeout_s:g} s and was stopped.", None
    if result.overflowed or len(result.kept) > max_output_bytes + 16:
        return f"The code's result is larger than the tool's output cap of {max_output_bytes} bytes.", None
    if not result.kept:
        return _death(returncode, limits), None
    try:
        reply = json.loads(result.kept)
    except ValueError:
        return "The sandbox's answer was cut short.", None
    if "error" in reply:
        if "BlockingIOError" in reply["error"]:
            return f"{reply['error']}\n(a tool may run at most {limits.processes} processes)", None
        return reply["error"], None
    return "", reply["output"]


def _death(returncode: int, limits: Limits) -> str:
    """Why the code ended without an answer, in the user's words."""
    signals = {signal.SIGXCPU: f"used more than {limits.cpu_s} s of CPU",
               signal.SIGKILL: "was killed (out of memory, or over a limit)",
               signal.SIGSEGV: f"crashed, most likely out of memory (limit {limits.memory_bytes // 2**20} MiB)",
               signal.SIGXFSZ: f"wrote a file larger than {limits.file_bytes // 2**20} MiB"}
    # bubblewrap's init reports a signal-killed child as 128 + the signal.
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if number in signals:
        return f"The code {signals[number]} and was stopped."
    return f"The code ended without an answer (exit status {returncode})."
