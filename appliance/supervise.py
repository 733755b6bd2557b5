"""Runs the appliance's systemd units where systemd is not PID 1 (a container, a chroot, a test): the same command
lines, environment files, users, start order and restart on failure, read from the unit files install.sh wrote.

    python appliance/supervise.py --units /etc/systemd/system --logs /opt/ai-factory/logs

Units start in the order of their After= lines; a oneshot unit's ExecStart lines run one after another and must
succeed before anything after it starts. A process that exits is started again after RestartSec (Restart=on-failure:
when it failed; always: whatever its status). Each unit's output goes to <logs>/<unit>.log, the journal's stand-in.
SIGTERM or SIGINT stops the processes in the reverse order, then runs the oneshot units' ExecStop lines.
"""

import argparse
import os
import pwd
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# Run as a script by supervise.sh, with the release's venv, which does not install the release's own code.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from appliance import env_file  # noqa: E402

TARGET = "ai-factory.target"
STOP_TIMEOUT = 30


@dataclass
class Service:
    name: str
    keys: dict[str, list[str]]
    process: subprocess.Popen | None = None
    restart_at: float | None = None
    restarts: int = 0
    after: list[str] = field(default_factory=list)

    def first(self, key: str, default: str = "") -> str:
        return self.keys.get(key, [default])[0]

    @property
    def oneshot(self) -> bool:
        return self.first("Type", "simple") == "oneshot"


def parse_unit(path: Path) -> dict[str, list[str]]:
    """A unit file's keys (of every section), each with all its values in order: ExecStart may repeat."""
    keys: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def ordered(units_dir: Path) -> list[Service]:
    """The target's units, each after those its After= names."""
    target = parse_unit(units_dir / TARGET)
    names = [name for value in target.get("Wants", []) for name in value.split()]
    services = {name: Service(name, parse_unit(units_dir / name)) for name in names}
    for service in services.values():
        service.after = [name for value in service.keys.get("After", []) for name in value.split()
                         if name in services]
    done: list[Service] = []
    while len(done) < len(services):
        ready = [s for s in services.values() if s not in done and all(services[a] in done for a in s.after)]
        if not ready:
            raise SystemExit(f"the units' After= lines make a cycle among {[s.name for s in services.values()]}")
        done.extend(ready)
    return done


class Supervisor:
    def __init__(self, services: list[Service], logs: Path, say=print):
        self.services, self.logs, self.say = services, logs, say
        self.stopping = False
        logs.mkdir(parents=True, exist_ok=True)

    def _spawn(self, service: Service, command: str) -> subprocess.Popen:
        """`command` as systemd runs an Exec line; its "+" prefix runs it with full privileges (not as User=)."""
        privileged = command.startswith("+")
        command = command.lstrip("+")
        env = dict(os.environ)
        for path in service.keys.get("EnvironmentFile", []):
            env.update(env_file.read(Path(path.removeprefix("-")), missing_ok=path.startswith("-")))
        for assignment in service.keys.get("Environment", []):
            for pair in shlex.split(assignment):
                key, _, value = pair.partition("=")
                env[key] = value
        user = service.first("User")
        preexec = None
        if user and os.geteuid() == 0 and user != "root" and not privileged:
            account = pwd.getpwnam(user)
            env.update(HOME=account.pw_dir, USER=user, LOGNAME=user)

            def preexec():
                os.setgid(account.pw_gid)
                os.initgroups(user, account.pw_gid)
                os.setuid(account.pw_uid)
        log = open(self.logs / f"{service.name.removesuffix('.service')}.log", "ab")
        try:
            return subprocess.Popen(shlex.split(command), cwd=service.first("WorkingDirectory") or None, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=preexec, start_new_session=True)
        finally:
            log.close()

    def start(self) -> None:
        for service in self.services:
            if self.stopping:
                return
            if service.oneshot:
                for command in service.keys.get("ExecStart", []):
                    self.say(f"==> {service.name}: {command}")
                    status = self._spawn(service, command).wait()
                    if status != 0:
                        raise SystemExit(f"{service.name} failed ({command}: status {status}); see "
                                         f"{self.logs}/{service.name.removesuffix('.service')}.log")
            else:
                self.say(f"==> starting {service.name}")
                service.process = self._spawn(service, service.first("ExecStart"))

    def watch_once(self) -> None:
        """Start again what exited, once its RestartSec has passed."""
        now = time.monotonic()
        for service in self.services:
            process = service.process
            if process is None or self.stopping:
                continue
            status = process.poll()
            if status is None:
                continue
            policy = service.first("Restart", "no")
            if policy == "always" or (policy == "on-failure" and status != 0):
                if service.restart_at is None:
                    service.restart_at = now + float(service.first("RestartSec", "1").rstrip("s"))
                    self.say(f"==> {service.name} exited with status {status}; restarting in "
                             f"{service.restart_at - now:.0f} s")
                elif now >= service.restart_at:
                    service.restart_at = None
                    service.restarts += 1
                    service.process = self._spawn(service, service.first("ExecStart"))

    def stop(self) -> None:
        self.stopping = True
        for service in reversed(self.services):
            process = service.process
            if process is not None and process.poll() is None:
                self.say(f"==> stopping {service.name}")
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            if service.oneshot:
                for command in service.keys.get("ExecStop", []):
                    try:
                        self._spawn(service, command).wait()
                    except OSError as exc:  # the rest must still stop
                        self.say(f"==> {service.name}: {command} could not run: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=Path, default=Path("/etc/systemd/system"))
    parser.add_argument("--logs", type=Path, required=True)
    args = parser.parse_args()
    supervisor = Supervisor(ordered(args.units), args.logs, say=lambda line: print(line, flush=True))

    def stop(signum, frame):
        supervisor.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        supervisor.start()
        while not supervisor.stopping:
            supervisor.watch_once()
            time.sleep(0.5)
    finally:
        supervisor.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
