"""`ai-factory upgrade`, as an appliance goes through it: an instance made by the previous release of this project
(appliance/PREVIOUS_RELEASE, taken from git history) is upgraded to this tree and answers as before; a migration that
fails rolls everything back byte for byte; a disk without room for the backup is refused before anything stops; and
the upgrader killed with SIGKILL at a step leaves what the next start (`ai-factory recover`) turns back into the old
release working.

The releases run as they would in an appliance, each a tree with its own venv; the previous release's venv sees
this one's packages (the pinned set has not changed between them) but not this tree's code."""

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db.migrations.loader import MigrationLoader

from tests.conftest import ROOT

# Minutes each (an instance of the previous release built, upgraded, broken and rolled back): `make test-all`.
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

UPGRADER = ROOT / "appliance" / "ai_factory.py"
SCRIPT = Path(__file__).with_name("instance_script.py")
QUERIES = ["What does error E77 on the press mean?", "How do I reset the NW-7 robot?", "grease for line 3"]
# What a copy of a release leaves behind: its venv (each release has its own), runtime state and caches.
NOT_RELEASE = shutil.ignore_patterns(".venv", ".git", "data", "logs", ".run", "node_modules", "__pycache__",
                                     "*.egg-info", ".pytest_cache", ".ruff_cache")


def _previous_commit() -> str:
    commit = (ROOT / "appliance" / "PREVIOUS_RELEASE").read_text().split()[0]
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode != 0:
        shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip()
        if shallow == "true":
            pytest.skip(f"the previous release {commit} is not in this shallow clone (git fetch --unshallow)")
        pytest.fail(f"the previous release {commit} (appliance/PREVIOUS_RELEASE) is not in this repository")
    return commit


def _release_venv(release: Path) -> None:
    """A venv of its own whose packages are this one's pinned set, without this tree's editable install."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(release / ".venv")], check=True)
    site = release / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "release-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def _private_redis_url() -> str:
    """The tests' Redis, in a database no worker of the test session reads: the instances' queued messages name
    their own documents, not the test database's."""
    parts = urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    return urlunsplit(parts._replace(path="/9"))


def _env(data: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(FACTORY_DATA_DIR=str(data), REDIS_URL=_private_redis_url(), FACTORY_NODE_NAME="upgrade-test")
    return env


def _instance(release: Path, data: Path, *argv: str) -> dict:
    done = subprocess.run([str(release / ".venv" / "bin" / "python"), str(SCRIPT), *argv], cwd=release,
                          env=_env(data), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def _probe(release: Path, data: Path, keys: dict) -> dict:
    return _instance(release, data, "probe", json.dumps(keys), json.dumps(QUERIES))


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def health_url():
    """Where the services' web answers /healthz: the upgrader polls it after starting them."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def previous_instance(tmp_path_factory, health_url):
    """An appliance prefix whose running release is the previous one, with an instance it made: a knowledge base
    with documents, a published app with a key, a workspace API key and a tool's secret. Its answers are recorded."""
    commit = _previous_commit()
    prefix = tmp_path_factory.mktemp("appliance") / "prefix"
    release = prefix / "releases" / commit[:12]
    release.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(release)], input=archive, check=True)
    _release_venv(release)
    (prefix / "current").symlink_to(release.relative_to(prefix))
    (prefix / "env").write_text(f"FACTORY_URL={health_url}\n")
    keys = _instance(release, prefix / "data", "seed")
    return {"prefix": prefix, "release": release, "keys": keys, "answers": _probe(release, prefix / "data", keys)}


@pytest.fixture
def appliance(previous_instance, tmp_path):
    """A copy of the previous release's appliance for one test, and a services command that records its calls and,
    starting them, runs the setup unit's first command (`ai-factory recover`), as systemd and the supervisor do."""
    prefix = tmp_path / "prefix"
    shutil.copytree(previous_instance["prefix"], prefix, symlinks=True)
    services = tmp_path / "services.sh"
    recover = f"{sys.executable} {UPGRADER} --prefix {prefix} --services none recover >>{tmp_path}/recover.log"
    # A supervisor takes a moment to stop and start the platform's processes.
    services.write_text(f'#!/bin/sh\necho "$1" >>{tmp_path}/services.log\n'
                        f'if [ "$1" = start ]; then {recover} || exit 1; fi\nsleep 1\n')
    services.chmod(0o755)
    release = prefix / "releases" / previous_instance["release"].name
    return {**previous_instance, "prefix": prefix, "release": release, "services": services,
            "services_log": tmp_path / "services.log", "recover_log": tmp_path / "recover.log"}


def _upgrader(appliance: dict, *argv: str, env: dict | None = None, **options):
    command = [sys.executable, str(UPGRADER), "--prefix", str(appliance["prefix"]), "--services",
               str(appliance["services"]), *argv]
    return subprocess.run(command, env=env or _env(appliance["prefix"] / "data"), capture_output=True, text=True,
                          timeout=600, **options)


def _state(prefix: Path) -> dict:
    """Every byte a user would miss: each file of the data dir, and the database's content."""
    data = prefix / "data"
    files = {path.relative_to(data).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
             for path in sorted(data.rglob("*")) if path.is_file() and not path.name.startswith("db.sqlite3")}
    database = sqlite3.connect(data / "db.sqlite3")
    try:
        dump = list(database.iterdump())
    finally:
        database.close()
    return {"files": files, "database": dump}


def _services_calls(appliance: dict) -> list[str]:
    log = appliance["services_log"]
    return log.read_text().split() if log.exists() else []


def test_an_instance_of_the_previous_release_upgrades_and_answers_as_before(appliance):
    upgraded = _upgrader(appliance, "upgrade", str(ROOT))

    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    prefix = appliance["prefix"]
    assert (prefix / "current").resolve() == ROOT
    assert not (prefix / "upgrade.json").exists()
    assert _services_calls(appliance) == ["stop", "start"]
    # The services' start (its setup step's recovery) found the upgrade in progress and left it to finish.
    assert "recovery: upgrade in progress" in appliance["recover_log"].read_text()
    backups = list((prefix / "backups").glob("pre-upgrade-*.tar"))
    assert len(backups) == 1 and str(backups[0]) in upgraded.stdout
    answers = _probe(ROOT, prefix / "data", appliance["keys"])
    # The same hits in the same order with the same dense and keyword scores, the app's key and the workspace key
    # answer, the secret decrypts. The fused score follows the default fusion, which this release moved for the
    # knowledge bases on it (z-scores among the candidates, migration rag_studio 0010).
    assert _without_fused(answers) == _without_fused(appliance["answers"])
    assert answers["secret"] == "erp-token-7f3a"
    assert all(answers["hits"][query] for query in QUERIES)


def _without_fused(answers: dict) -> dict:
    return {**answers, "hits": {query: [{**{key: value for key, value in hit.items() if key != "score"},
                                         "scores": {key: value for key, value in hit["scores"].items()
                                                    if key != "fused"}}
                                        for hit in hits]
                                for query, hits in answers["hits"].items()}}


def _failing_release(tmp_path: Path) -> Path:
    """This tree, plus a migration that changes the schema and then fails, applied after every real one."""
    release = tmp_path / "failing-release"
    shutil.copytree(ROOT, release, ignore=NOT_RELEASE)
    _release_venv(release)
    leaves = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes()
    (release / "accounts" / "migrations" / "9999_fails_on_purpose.py").write_text(
        "from django.db import migrations\n\n\n"
        "def fail(apps, schema_editor):\n"
        "    raise RuntimeError('this migration fails on purpose')\n\n\n"
        "class Migration(migrations.Migration):\n"
        f"    dependencies = {sorted(leaves)!r}\n"
        "    operations = [migrations.RunSQL('CREATE TABLE upgrade_probe (x integer)'), migrations.RunPython(fail)]\n")
    return release


def test_a_failing_migration_rolls_back_to_the_old_release_and_every_byte(appliance, tmp_path):
    before = _state(appliance["prefix"])

    failed = _upgrader(appliance, "upgrade", str(_failing_release(tmp_path)))

    assert failed.returncode == 1
    assert "failed at 'migrate'" in failed.stderr and "this migration fails on purpose" in failed.stderr
    assert "was rolled back" in failed.stderr
    prefix = appliance["prefix"]
    assert (prefix / "current").resolve() == appliance["release"]
    assert not (prefix / "upgrade.json").exists()
    assert _state(prefix) == before
    assert _services_calls(appliance) == ["stop", "stop", "start"]
    assert _probe(appliance["release"], prefix / "data", appliance["keys"])["hits"] == appliance["answers"]["hits"]


def test_a_disk_without_room_for_the_backup_is_refused_before_anything_stops(appliance):
    before = _state(appliance["prefix"])
    env = {**_env(appliance["prefix"] / "data"), "FACTORY_UPGRADE_RESERVE": str(1 << 60)}

    refused = _upgrader(appliance, "upgrade", str(ROOT), env=env)

    assert refused.returncode == 2
    assert "the backup needs" in refused.stderr and "nothing was stopped or changed" in refused.stderr
    assert _services_calls(appliance) == []
    assert (appliance["prefix"] / "current").resolve() == appliance["release"]
    assert _state(appliance["prefix"]) == before
    assert not list((appliance["prefix"] / "backups").iterdir())


@pytest.mark.parametrize("step", [
    pytest.param("stop", marks=pytest.mark.slow),
    pytest.param("backup", marks=pytest.mark.slow),
    "migrate",
    pytest.param("start", marks=pytest.mark.slow),
    pytest.param("health", marks=pytest.mark.slow),
])
def test_the_upgrader_killed_at_a_step_leaves_the_old_release_working_at_the_next_start(appliance, step):
    before = _state(appliance["prefix"])
    journal = appliance["prefix"] / "upgrade.json"
    command = [sys.executable, str(UPGRADER), "--prefix", str(appliance["prefix"]), "--services",
               str(appliance["services"]), "upgrade", str(ROOT)]
    # Its own session, so that the kill takes the manage.py it runs too, as a power cut would.
    upgrader = subprocess.Popen(command, env=_env(appliance["prefix"] / "data"), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while upgrader.poll() is None and time.monotonic() < deadline:
        try:
            if json.loads(journal.read_text()).get("step") == step:
                break
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)
    assert upgrader.poll() is None, f"the upgrader ended before the step '{step}'"
    os.killpg(upgrader.pid, signal.SIGKILL)
    upgrader.wait()
    assert journal.exists()

    recovered = _upgrader(appliance, "recover")

    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "recovery: rolled back" in recovered.stdout
    assert (appliance["prefix"] / "current").resolve() == appliance["release"]
    assert not journal.exists()
    assert _state(appliance["prefix"]) == before
    assert _services_calls(appliance)[-1] == "start"
    assert _probe(appliance["release"], appliance["prefix"] / "data", appliance["keys"])["hits"] == \
        appliance["answers"]["hits"]
