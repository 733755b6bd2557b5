"""The first thing every new user does: `make run` on a fresh clone and an empty data dir, a chat with each preset
through the gateway, then `make stop`. The real process set (Redis, the node, ingestion and interactive workers,
beat, web, the engines) is started by the README's command, in a copy of this checkout, with the node worker at
concurrency 4 so that its replica starts race each other for every file the installation makes once."""

import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from serving.preset_names import DEPLOYED_AT_SETUP
from tests.conftest import ROOT, free_port

# A minute and more (the whole of `make run` and `make stop`): `make test-all`, and by hand before every release.
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def _fresh_clone(target: Path) -> None:
    """The checkout's files as a clone would have them (tracked and new, nothing ignored), with the installed venv
    and the vendored browser libraries, so that `make run`'s install finds them in place."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name, follow_symlinks=False)
    (target / ".venv").symlink_to(ROOT / ".venv")
    shutil.copytree(ROOT / "static" / "vendor", target / "static" / "vendor")


def _processes_of(data_dir: Path) -> list[str]:
    """Every process started for this installation: each inherits its data dir in its environment."""
    marker = f"FACTORY_DATA_DIR={data_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{entry.name} {command}")
        except OSError:
            continue
    return found


def _make(clone: Path, target: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", target], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _manage_shell(clone: Path, env: dict, script: str) -> str:
    done = subprocess.run([".venv/bin/python", "manage.py", "shell", "-c", script], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def _api_key(clone: Path, env: dict) -> str:
    script = ("from django.contrib.auth import get_user_model\n"
              "from accounts.models import Workspace\n"
              "from accounts.services import Actor, create_api_key\n"
              "user = get_user_model().objects.get(username='admin')\n"
              "workspace = Workspace.objects.filter(memberships__user=user).order_by('id').first()\n"
              "print(create_api_key(actor=Actor(user=user), workspace=workspace, name='first start').secret)\n")
    return _manage_shell(clone, env, script).strip().splitlines()[-1]


def test_make_run_on_an_empty_data_dir_serves_every_preset_and_make_stop_leaves_nothing(tmp_path):
    clone, data_dir = tmp_path / "clone", tmp_path / "data"
    _fresh_clone(clone)
    web_port = free_port()
    # The machine's environment as a new user has it: nothing of the test run's own platform.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("FACTORY_", "DJANGO_", "PROMETHEUS_")) and name not in ("REDIS_URL",
                                                                                            "DATABASE_URL")}
    env |= {"FACTORY_DATA_DIR": str(data_dir), "FACTORY_PORT": str(web_port), "FACTORY_REDIS_PORT": str(free_port()),
            "FACTORY_NODE_CONCURRENCY": "4", "FACTORY_ADMIN_PASSWORD": "first-start-password"}
    try:
        started = _make(clone, "run", env, timeout=600)
        assert started.returncode == 0, f"make run failed:\n{started.stdout[-4000:]}\n{started.stderr[-4000:]}"
        assert f"AI Factory is running at http://127.0.0.1:{web_port}" in started.stdout

        auth = {"Authorization": f"Bearer {_api_key(clone, env)}"}
        for model in DEPLOYED_AT_SETUP:
            answer = httpx.post(f"http://127.0.0.1:{web_port}/v1/chat/completions", headers=auth, timeout=120,
                                json={"model": model, "max_tokens": 8,
                                      "messages": [{"role": "user", "content": "Say hello."}]})
            assert answer.status_code == 200, f"{model}: {answer.text}"
            assert answer.json()["choices"][0]["message"]["content"]

        # A replica whose engine key no configured key decrypts (a key lost or changed) must not keep make stop
        # from stopping everything.
        _manage_shell(clone, env, "from cryptography.fernet import Fernet\n"
                                  "from serving.models import Replica\n"
                                  "foreign = 'fernet:' + Fernet(Fernet.generate_key()).encrypt(b'x').decode()\n"
                                  "Replica.objects.filter(pk=Replica.objects.order_by('pk')[0].pk)"
                                  ".update(api_key=foreign)\n")
        stopped = _make(clone, "stop", env, timeout=180)
        assert stopped.returncode == 0, f"make stop failed:\n{stopped.stdout}\n{stopped.stderr}"
        for name in ("web", "beat", "interactive", "worker", "node", "redis"):
            assert f"stopping {name}" in stopped.stdout
        assert "engine process(es) of this node's replicas" in stopped.stdout
        assert _processes_of(data_dir) == []
    finally:
        for line in _processes_of(data_dir):
            os.kill(int(line.split()[0]), signal.SIGKILL)
