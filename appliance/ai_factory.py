"""`ai-factory`: the appliance's upgrade in place, and its recovery at start (README "Appliance").

An appliance prefix (default /opt/ai-factory) holds:

    releases/<version>/   one tree per installed release, each with its own .venv
    current               a symlink to the release that runs
    data/                 FACTORY_DATA_DIR: the SQLite database, uploads, indexes, models, keys
    backups/              the backup each upgrade takes before it changes anything
    env                   KEY=VALUE lines every platform process reads (the data dir, Redis, the URL)
    upgrade.json          the journal of an upgrade in progress; absent when none is

`ai-factory upgrade RELEASE` checks the disk has room for a backup (and refuses before stopping anything when it has
not), stops the services, backs the instance up with the running release's own `manage.py backup` and checks the
archive as a restore would (assets.backup.verify), points `current` at the new release, migrates the database,
starts the services and checks their health. Each step is written to the journal before it begins. If a step fails,
or the upgrader dies (power loss, kill -9) and `ai-factory recover` runs at the next start, the upgrade is rolled
back: every file of the backup is checked against its manifest (assets.backup.unpack) and put back in place with the
database, what the new release wrote in the data dir is removed, `current` points at the old release again and the
services start on it. Rolling back is idempotent, so a rollback cut short is done again. Only a journal that reached
the end counts as an upgrade done: the next start then finds the new release complete.

The database must be SQLite (the appliance's default): with DATABASE_URL (Postgres) the upgrade is refused, as a
rollback could not put the database back by itself.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

RELEASE_ROOT = Path(__file__).resolve().parent.parent
# Run as a script with the release's venv, which does not install the release's own code.
sys.path.insert(0, str(RELEASE_ROOT))
from appliance import env_file  # noqa: E402
from assets import backup as backup_format  # noqa: E402  (what a backup keeps and how it is checked, this release's)

STEPS = ("stop", "backup", "switch", "migrate", "start", "health")
# Room kept free on the backups' disk beyond the backup itself, so that an upgrade never fills the disk the
# platform writes to.
DEFAULT_RESERVE = 1 << 30
# A backup is a tar of the kept files and the database: their sizes, plus tar's headers and padding.
TAR_OVERHEAD = 1.05
HEALTH_TIMEOUT = 180


class UpgradeRefused(Exception):
    """Nothing was changed: the message says why."""


class StepFailed(Exception):
    """A step of the upgrade failed; the upgrade was rolled back."""


class Appliance:
    def __init__(self, prefix: Path, services: str, reserve: int = DEFAULT_RESERVE):
        self.prefix = prefix
        self.current = prefix / "current"
        self.data = prefix / "data"
        self.backups = prefix / "backups"
        self.journal_path = prefix / "upgrade.json"
        self.services = services
        self.reserve = reserve

    # ---- the journal ----

    def journal(self) -> dict | None:
        try:
            return json.loads(self.journal_path.read_text())
        except FileNotFoundError:
            return None

    def write_journal(self, journal: dict) -> None:
        """Atomically, and on disk before the step it names begins."""
        partial = self.journal_path.with_name(self.journal_path.name + ".partial")
        with partial.open("w") as file:
            json.dump(journal, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, self.journal_path)
        _fsync_dir(self.prefix)

    def end_journal(self) -> None:
        self.journal_path.unlink(missing_ok=True)
        _fsync_dir(self.prefix)

    # ---- releases ----

    def running_release(self) -> Path:
        if not self.current.is_symlink():
            raise UpgradeRefused(f"{self.current} is not a symlink to a release; is {self.prefix} an appliance "
                                 f"prefix (see install.sh --prefix)?")
        return self.current.resolve()

    def point_current_at(self, release: Path) -> None:
        link = self.prefix / ".current.new"
        link.unlink(missing_ok=True)
        link.symlink_to(release)
        os.replace(link, self.current)
        _fsync_dir(self.prefix)

    def env(self) -> dict:
        env = {**os.environ, **env_file.read(self.prefix / "env", missing_ok=True)}
        env["FACTORY_DATA_DIR"] = str(self.data)
        env.pop("DJANGO_SETTINGS_MODULE", None)
        return env

    def manage(self, release: Path, *argv: str) -> subprocess.CompletedProcess:
        """`manage.py` of a release, with its own python, on this appliance's data, as the user who owns the data
        (the services' user): files it makes, the database's journal among them, stay theirs."""
        return subprocess.run([str(_python(release)), "manage.py", *argv], cwd=release, env=self.env(),
                              capture_output=True, text=True, **_as_owner_of(self.data))

    # ---- services ----

    def control_services(self, action: str) -> None:
        """systemd (the units install.sh writes), none (the operator stops and starts them), or a command given
        `stop` or `start` (another supervisor)."""
        if self.services == "none":
            return
        if self.services == "systemd":
            command = ["systemctl", action, "ai-factory.target"]
        else:
            command = [self.services, action]
        done = subprocess.run(command, env=self.env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise StepFailed(f"{' '.join(command)} failed: {(done.stderr or done.stdout).strip()[-500:]}")

    def check_health(self, release: Path) -> None:
        migrations = self.manage(release, "migrate", "--check", "--noinput")
        if migrations.returncode != 0:
            raise StepFailed(f"migrations are left unapplied: {_tail(migrations)}")
        if self.services == "none":
            return
        url = self.env().get("FACTORY_URL", "http://127.0.0.1:8000").rstrip("/") + "/healthz"
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise StepFailed(f"{url} did not answer within {HEALTH_TIMEOUT} s")
            time.sleep(1)

    # ---- upgrade ----

    def backup_size(self) -> int:
        files = sum(path.stat().st_size for path in backup_format.data_files(self.data) if path.exists())
        database = self.data / "db.sqlite3"
        return int((files + (database.stat().st_size if database.exists() else 0)) * TAR_OVERHEAD)

    def preflight(self, release: Path) -> Path:
        if self.journal() is not None:
            raise UpgradeRefused(f"an upgrade was cut short ({self.journal_path}); run `ai-factory recover` first")
        if os.environ.get("DATABASE_URL") or self.env().get("DATABASE_URL"):
            raise UpgradeRefused("the upgrade rolls back SQLite instances only, and DATABASE_URL is set: back up the "
                                 "database with your Postgres tools, then upgrade the release by hand")
        old = self.running_release()
        if not (release / "manage.py").is_file() or not _python(release).exists():
            raise UpgradeRefused(f"{release} is not a release: it needs manage.py and .venv/bin/python")
        if release == old:
            raise UpgradeRefused(f"{release} is already the running release")
        need = self.backup_size()
        self.backups.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.backups).free
        if free < need + self.reserve:
            raise UpgradeRefused(
                f"the backup needs {_size(need)} and {self.backups} has {_size(free)} free (keeping "
                f"{_size(self.reserve)} in reserve); free some space or set FACTORY_UPGRADE_RESERVE; nothing was "
                f"stopped or changed")
        return old

    def upgrade(self, release: Path, say) -> None:
        release = release.resolve()
        old = self.preflight(release)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        journal = {"from": str(old), "to": str(release), "upgrader": str(Path(__file__).resolve()),
                   "upgrader_pid": os.getpid(), "upgrader_process": _process_identity(os.getpid()),
                   "started_at": time.time(), "backup": str(self.backups / f"pre-upgrade-{stamp}.tar"),
                   "backup_done": False, "state": "upgrading", "step": None}
        try:
            for step in STEPS:
                journal["step"] = step
                self.write_journal(journal)
                say(f"==> {step}")
                self.run_step(step, journal)
        except (StepFailed, OSError) as exc:
            say(f"error: the upgrade failed at '{journal['step']}': {exc}")
            say("==> rolling back to the backup and the old release")
            self.roll_back(say)
            raise StepFailed(f"the upgrade to {release} failed at '{journal['step']}' and was rolled back: {exc}")
        self.end_journal()
        say(f"==> upgraded to {release}; the backup taken before is {journal['backup']}")

    def run_step(self, step: str, journal: dict) -> None:
        old, new = Path(journal["from"]), Path(journal["to"])
        if step == "stop":
            self.control_services("stop")
        elif step == "backup":
            done = self.manage(old, "backup", "--output", journal["backup"])
            if done.returncode != 0:
                raise StepFailed(f"the backup failed: {_tail(done)}")
            try:
                backup_format.verify(Path(journal["backup"]))
            except backup_format.RestoreRefused as exc:
                raise StepFailed(f"the backup {journal['backup']} does not check out: {exc}")
            journal["backup_done"] = True
            self.write_journal(journal)
        elif step == "switch":
            self.point_current_at(new)
        elif step == "migrate":
            done = self.manage(new, "migrate", "--noinput")
            if done.returncode != 0:
                raise StepFailed(f"the migration failed: {_tail(done)}")
        elif step == "start":
            self.control_services("start")
        elif step == "health":
            self.check_health(new)

    # ---- rollback and recovery ----

    def recover(self, say) -> str:
        """At start: finish what an upgrade cut short. Returns what was found: none, an upgrade in progress (its
        own start step starts the services, and with them this), or rolled back."""
        journal = self.journal()
        if journal is None:
            return "none"
        pid = journal.get("upgrader_pid")
        if pid and _process_identity(pid) == journal.get("upgrader_process"):
            say(f"==> an upgrade is in progress (the upgrader, pid {pid}, is at '{journal['step']}'); it finishes "
                f"or rolls back by itself")
            return "upgrade in progress"
        say(f"==> an upgrade was cut short ({self.journal_path}); rolling back")
        self.roll_back(say)
        return "rolled back"

    def roll_back(self, say) -> None:
        journal = self.journal()
        journal["state"] = "rolling back"
        self.write_journal(journal)
        try:
            self.control_services("stop")
        except StepFailed as exc:
            say(f"warning: {exc}")
        backup_file = Path(journal["backup"])
        if journal["backup_done"]:
            restore_in_place(backup_file, self.data, since=journal["started_at"])
            say(f"==> restored the database and {self.data} from {backup_file}")
        else:
            # Cut short before the backup was complete: nothing had been changed yet.
            backup_file.with_name(f".{backup_file.name}.partial").unlink(missing_ok=True)
        self.point_current_at(Path(journal["from"]))
        self.end_journal()
        self.control_services("start")
        say(f"==> running {journal['from']} again")


def restore_in_place(archive: Path, data: Path, *, since: float) -> None:
    """Put the data dir back as the backup holds it: every member checked against the manifest in a staging dir
    first, then moved into place; the files the new release made since the upgrade began (and a backup would keep)
    removed. Logs, engine state and other files a backup leaves out stay as they are."""
    staging = data.parent / ".rollback-staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        manifest = backup_format.unpack(archive, staging)
    except backup_format.RestoreRefused as exc:
        raise StepFailed(f"the backup {archive} cannot be restored, and nothing was changed: {exc}")
    if manifest["database"]["member"] != backup_format.SQLITE_MEMBER:
        raise StepFailed(f"{archive} holds no SQLite database")
    listed = {member[len(backup_format.DATA_PREFIX):] for member in manifest["files"]
              if member.startswith(backup_format.DATA_PREFIX)}
    for path in sorted(data.rglob("*")):
        relative = path.relative_to(data).as_posix()
        if (path.is_file() and relative not in listed and backup_format.kept(relative)
                and path.stat().st_mtime >= since):
            path.unlink()
    for name in ("db.sqlite3-wal", "db.sqlite3-shm"):
        (data / name).unlink(missing_ok=True)
    owner = _as_owner_of(data)
    os.replace(staging / backup_format.SQLITE_MEMBER, data / "db.sqlite3")
    placed = [data / "db.sqlite3"]
    for relative in sorted(listed):
        target = data / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / backup_format.DATA_PREFIX / relative, target)
        placed.append(target)
    if owner:
        # Unpacked by root: given back to the services' user, dirs made on the way included.
        for path in [*placed, *(path for path in data.rglob("*") if path.is_dir())]:
            os.chown(path, owner["user"], owner["group"])
    shutil.rmtree(staging, ignore_errors=True)
    for directory in sorted((path for path in data.rglob("*") if path.is_dir()), reverse=True):
        if not any(directory.iterdir()) and directory.stat().st_mtime >= since:
            directory.rmdir()
    _fsync_dir(data)


def _as_owner_of(path: Path) -> dict:
    """subprocess.run's user and group for a root upgrader acting on another user's data; nothing otherwise."""
    owner = path.stat()
    if os.geteuid() != 0 or owner.st_uid == 0:
        return {}
    return {"user": owner.st_uid, "group": owner.st_gid}


def _process_identity(pid: int) -> str | None:
    """boot:pid:start time of a live process, None for one that is gone: a pid alone could be another process's
    after a reboot, or later in the same boot."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    state, start_time = fields[0], fields[19]
    return None if state in ("Z", "X") else f"{boot}:{pid}:{start_time}"


def _python(release: Path) -> Path:
    return release / ".venv" / "bin" / "python"


def _tail(done: subprocess.CompletedProcess) -> str:
    return (done.stderr or done.stdout).strip()[-1500:]


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ai-factory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=Path, default=Path(os.environ.get("FACTORY_PREFIX", "/opt/ai-factory")))
    parser.add_argument("--services", default=os.environ.get("FACTORY_SERVICES", "systemd"),
                        help="systemd, none, or a command taking stop|start")
    commands = parser.add_subparsers(dest="command", required=True)
    upgrade = commands.add_parser("upgrade", help="upgrade to a release dir, rolling back on any failure")
    upgrade.add_argument("release", type=Path)
    commands.add_parser("recover", help="at start: roll back an upgrade that was cut short")
    args = parser.parse_args(argv)
    reserve = int(os.environ.get("FACTORY_UPGRADE_RESERVE", DEFAULT_RESERVE))
    appliance = Appliance(args.prefix.resolve(), args.services, reserve)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        if args.command == "upgrade":
            started = time.monotonic()
            appliance.upgrade(args.release, say)
            say(f"==> the upgrade took {time.monotonic() - started:.1f} s")
        else:
            say(f"==> recovery: {appliance.recover(say)}")
    except UpgradeRefused as exc:
        print(f"error: the upgrade was refused: {exc}", file=sys.stderr)
        return 2
    except StepFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
