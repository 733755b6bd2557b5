"""The appliance's services: the systemd units install.sh writes (one for each process of scripts/proc.sh, restart
on failure, ordered start, the journal, resource limits), and appliance/supervise.py, which runs the same units'
command lines where systemd is not PID 1: in order, restarted when killed, stopped on SIGTERM; and supervise.sh, which
starts and stops it for the prefix it is installed in, however it is called."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from appliance import supervise, units
from tests.conftest import ROOT

PREFIX = Path("/opt/plant-ai")


def _proc_roles() -> set[str]:
    """The long-running processes scripts/proc.sh knows, from its usage line."""
    usage = re.search(r"usage: \$0 ([a-z|]+)", (ROOT / "scripts" / "proc.sh").read_text()).group(1)
    return set(usage.split("|")) - {"setup"}


def test_every_process_of_the_platform_has_a_unit_that_restarts_it_after_redis_and_setup(tmp_path):
    written = units.write_units(PREFIX, "plant-ai", tmp_path)

    assert {path.name for path in written} == {
        "ai-factory.target", "ai-factory-redis.service", "ai-factory-setup.service",
        *(f"ai-factory-{role}.service" for role in _proc_roles())}
    for role in _proc_roles():
        unit = supervise.parse_unit(tmp_path / f"ai-factory-{role}.service")
        assert unit["ExecStart"] == [f"{PREFIX}/current/scripts/proc.sh {role}"]
        assert unit["Restart"] == ["on-failure"] and unit["User"] == ["plant-ai"]
        assert {"ai-factory-redis.service", "ai-factory-setup.service"} <= set(unit["After"][0].split())
        assert unit["After"] == unit["Requires"]
        assert unit["EnvironmentFile"] == [f"{PREFIX}/env"]
        assert unit["StandardOutput"] == ["journal"] and unit["LimitNOFILE"] == ["65536"]
    setup = supervise.parse_unit(tmp_path / "ai-factory-setup.service")
    # An upgrade cut short is rolled back before anything migrates or starts.
    assert setup["ExecStart"] == [f"+{PREFIX}/bin/ai-factory --services none recover",
                                  f"{PREFIX}/current/scripts/proc.sh setup"]
    assert setup["Type"] == ["oneshot"] and "stop_engines" in setup["ExecStop"][0]
    assert "MemoryMax" in supervise.parse_unit(tmp_path / "ai-factory-web.service")
    target = supervise.parse_unit(tmp_path / "ai-factory.target")
    assert target["WantedBy"] == ["multi-user.target"]
    order = [service.name for service in supervise.ordered(tmp_path)]
    assert order[:2] == ["ai-factory-redis.service", "ai-factory-setup.service"]
    assert order.index("ai-factory-node.service") < order.index("ai-factory-web.service")


def _wait_for(condition, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_the_supervisor_runs_the_units_in_order_restarts_a_killed_process_and_stops_on_sigterm(tmp_path):
    """Units of the same shape as the platform's, whose commands leave traces: setup writes a file, the service
    refuses to start without it and records each start's PID; setup's stop step records that it ran."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "env").write_text(f"TRACE_DIR={work}\n")
    service = (f"{sys.executable} -c \"import os, time; from pathlib import Path; d = Path(os.environ['TRACE_DIR']); "
               f"assert (d / 'setup-done').exists(); open(d / 'starts', 'a').write(f'{{os.getpid()}}\\n'); "
               f"time.sleep(600)\"")
    made = [units.Unit("setup", "setup", [f"+touch {work}/setup-done"], oneshot=True,
                       exec_stop=[f"touch {work}/stopped"]),
            units.Unit("worker", "worker", [service], after=["ai-factory-setup.service"])]
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    for unit in made:
        text = units.render(unit, tmp_path, os.environ.get("USER", "root")).replace("RestartSec=5", "RestartSec=1")
        text = text.replace(f"WorkingDirectory={tmp_path}/current", f"WorkingDirectory={tmp_path}")
        (unit_dir / unit.file).write_text(text)
    (unit_dir / units.TARGET).write_text(units.render_target(made))

    supervisor = subprocess.Popen([sys.executable, "-m", "appliance.supervise", "--units", str(unit_dir), "--logs",
                                   str(tmp_path / "logs")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        first = int(_wait_for(lambda: (work / "starts").exists() and (work / "starts").read_text().split()[:1])[0])
        os.kill(first, signal.SIGKILL)
        pids = _wait_for(lambda: len(starts := (work / "starts").read_text().split()) == 2 and starts)
        assert int(pids[1]) != first
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(60) == 0
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    second = int(pids[1])
    assert not Path(f"/proc/{second}").exists() or Path(f"/proc/{second}/stat").read_text().split()[2] == "Z"
    assert (work / "stopped").exists()
    output = supervisor.stdout.read()
    assert "ai-factory-worker.service exited with status -9; restarting" in output


def _installed(prefix: Path) -> Path:
    """A prefix as install.sh lays it out: this tree's appliance/ in releases/<version>, `current` a relative link to
    it, the release's venv python (this interpreter: supervise.py needs only the standard library), the env file,
    and units of one long-running service."""
    release = prefix / "releases" / "0.1.0+test"
    shutil.copytree(ROOT / "appliance", release / "appliance", ignore=shutil.ignore_patterns("__pycache__"))
    (release / ".venv" / "bin").mkdir(parents=True)
    (release / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (prefix / "current").symlink_to(release.relative_to(prefix))
    (prefix / "env").write_text("")
    sleeper = units.Unit("sleeper", "a service that sleeps", ["sleep 600"])
    (prefix / "units").mkdir()
    (prefix / "units" / sleeper.file).write_text(units.render(sleeper, prefix, os.environ.get("USER", "root")))
    (prefix / "units" / units.TARGET).write_text(units.render_target([sleeper]))
    return release


def _supervise_sh(script: str, action: str, *, cwd: Path, prefix: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "FACTORY_PREFIX"}
    return subprocess.run([script, action], cwd=cwd, env={**env, "FACTORY_UNITS_DIR": str(prefix / "units")},
                          capture_output=True, text=True, timeout=150)


def test_supervise_sh_through_current_from_another_directory_finds_the_prefix_it_is_installed_in(tmp_path):
    prefix = tmp_path / "prefix"
    _installed(prefix)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    through_current = "../prefix/current/appliance/supervise.sh"
    pidfile = prefix / "supervise.pid"

    started = _supervise_sh(through_current, "start", cwd=elsewhere, prefix=prefix)
    try:
        assert started.returncode == 0, started.stderr
        pid = int(_wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))
        _wait_for(lambda: "starting ai-factory-sleeper.service" in (prefix / "logs" / "supervise.log").read_text())

        status = _supervise_sh(through_current, "status", cwd=elsewhere, prefix=prefix)
        assert status.returncode == 0 and f"supervising (pid {pid})" in status.stdout
        stopped = _supervise_sh(str(prefix / "current" / "appliance" / "supervise.sh"), "stop", cwd=tmp_path,
                                prefix=prefix)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped the supervisor (pid {pid}) of {prefix.resolve()}" in stopped.stdout
        assert not pidfile.exists()
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    finally:
        subprocess.run([str(prefix / "current" / "appliance" / "supervise.sh"), "stop"],
                       env={**os.environ, "FACTORY_PREFIX": str(prefix)}, capture_output=True, timeout=150)


def test_supervise_sh_stop_with_no_supervisor_says_so_and_stops_nothing_else(tmp_path):
    """Nothing to stop is success, as for `systemctl stop`: an upgrade of services already stopped goes on. A PID
    file whose PID is now another process's stops nothing."""
    prefix = tmp_path / "prefix"
    _installed(prefix)
    script = str(prefix / "current" / "appliance" / "supervise.sh")

    stopped = _supervise_sh(script, "stop", cwd=tmp_path, prefix=prefix)

    assert stopped.returncode == 0
    assert f"nothing to stop: no supervisor runs for {prefix.resolve()}" in stopped.stdout
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        (prefix / "supervise.pid").write_text(f"{bystander.pid}\n")
        stopped = _supervise_sh(script, "stop", cwd=tmp_path, prefix=prefix)
        assert stopped.returncode == 0 and "nothing to stop" in stopped.stdout
        assert bystander.poll() is None
        assert not (prefix / "supervise.pid").exists()
    finally:
        bystander.kill()
        bystander.wait()
