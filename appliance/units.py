"""The appliance's systemd units, written by install.sh: Redis, a setup step, and the platform's processes of
scripts/proc.sh (node, worker, interactive, beat, web), under one ai-factory.target that starts at boot.

    python appliance/units.py --prefix /opt/ai-factory --user ai-factory --output /etc/systemd/system

Each process restarts when it fails, starts after what it needs (Redis, then setup: recovery of a cut-short upgrade,
migrations, bootstrap), logs to the journal and has resource limits. Every command runs from `<prefix>/current`, so
an upgrade that points it at another release changes no unit. Where systemd is not PID 1, appliance/supervise.py runs
the same units' command lines.
"""

import argparse
from dataclasses import dataclass, field
from pathlib import Path

TARGET = "ai-factory.target"


@dataclass
class Unit:
    name: str
    description: str
    exec_start: list[str]
    after: list[str] = field(default_factory=list)
    oneshot: bool = False
    exec_stop: list[str] = field(default_factory=list)
    limits: dict[str, str] = field(default_factory=dict)
    # Engine replicas run in sessions of their own and outlive a restart of the node worker that started them, as
    # under `make run`; ai-factory-setup's stop step stops them when the platform stops.
    kill_mode: str = "control-group"

    @property
    def file(self) -> str:
        return f"ai-factory-{self.name}.service"


def platform_units(prefix: Path, redis_port: int = 6379) -> list[Unit]:
    current, data = prefix / "current", prefix / "data"
    proc = f"{current}/scripts/proc.sh"
    python = f"{current}/.venv/bin/python"
    needs = ["ai-factory-redis.service", "ai-factory-setup.service"]
    files = {"LimitNOFILE": "65536"}
    return [
        Unit("redis", "AI Factory: Redis (Celery's broker and the cache)",
             [f"/usr/bin/redis-server --bind 127.0.0.1 --port {redis_port} --protected-mode yes --daemonize no "
              f"--dir {data}/redis --appendonly yes"],
             limits={**files, "MemoryMax": "2G"}),
        Unit("setup", "AI Factory: recovery of a cut-short upgrade, migrations and bootstrap",
             # "+": recovery runs as root, as the upgrade did (it points current at a release).
             [f"+{prefix}/bin/ai-factory --services none recover", f"{proc} setup"],
             after=["ai-factory-redis.service"], oneshot=True,
             exec_stop=[f"{python} {current}/manage.py stop_engines"]),
        Unit("node", "AI Factory: this machine's jobs (model replicas, training) and heartbeats",
             [f"{proc} node"], after=needs, limits={**files, "TasksMax": "4096"}, kill_mode="process"),
        Unit("worker", "AI Factory: document ingestion", [f"{proc} worker"], after=needs,
             limits={**files, "MemoryMax": "8G", "TasksMax": "1024"}),
        Unit("interactive", "AI Factory: evaluations, tuning and calibration", [f"{proc} interactive"], after=needs,
             limits={**files, "MemoryMax": "8G", "TasksMax": "1024"}),
        Unit("beat", "AI Factory: the periodic sweeps", [f"{proc} beat"], after=needs,
             limits={**files, "MemoryMax": "512M"}),
        Unit("web", "AI Factory: the web server, API and OpenAI-compatible gateway", [f"{proc} web"],
             after=[*needs, "ai-factory-node.service"], limits={**files, "MemoryMax": "4G", "TasksMax": "1024"}),
    ]


def render(unit: Unit, prefix: Path, user: str) -> str:
    requires = " ".join(unit.after)
    lines = ["[Unit]", f"Description={unit.description}", f"PartOf={TARGET}"]
    if requires:
        lines += [f"After={requires}", f"Requires={requires}"]
    lines += ["", "[Service]", f"Type={'oneshot' if unit.oneshot else 'simple'}", f"User={user}", f"Group={user}",
              f"WorkingDirectory={prefix}/current", f"EnvironmentFile={prefix}/env"]
    lines += [f"ExecStart={command}" for command in unit.exec_start]
    lines += [f"ExecStop={command}" for command in unit.exec_stop]
    if unit.oneshot:
        lines += ["RemainAfterExit=yes", "TimeoutStartSec=900"]
    else:
        lines += ["Restart=on-failure", "RestartSec=5", f"KillMode={unit.kill_mode}", "TimeoutStopSec=60"]
    lines += ["StandardOutput=journal", "StandardError=journal", f"SyslogIdentifier=ai-factory-{unit.name}"]
    lines += [f"{key}={value}" for key, value in unit.limits.items()]
    lines += ["", "[Install]", f"WantedBy={TARGET}", ""]
    return "\n".join(lines)


def render_target(units: list[Unit]) -> str:
    wants = " ".join(unit.file for unit in units)
    return "\n".join(["[Unit]", "Description=AI Factory (every process of the platform)", f"Wants={wants}",
                      f"After={wants}", "", "[Install]", "WantedBy=multi-user.target", ""])


def write_units(prefix: Path, user: str, output: Path, redis_port: int = 6379) -> list[Path]:
    output.mkdir(parents=True, exist_ok=True)
    units = platform_units(prefix, redis_port)
    written = []
    for unit in units:
        path = output / unit.file
        path.write_text(render(unit, prefix, user))
        written.append(path)
    target = output / TARGET
    target.write_text(render_target(units))
    return [*written, target]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=Path, default=Path("/opt/ai-factory"))
    parser.add_argument("--user", default="ai-factory")
    parser.add_argument("--output", type=Path, default=Path("/etc/systemd/system"))
    parser.add_argument("--redis-port", type=int, default=6379)
    args = parser.parse_args()
    for path in write_units(args.prefix, args.user, args.output, args.redis_port):
        print(path)


if __name__ == "__main__":
    main()
