"""Redis restarted under a running web process: the gateway's rate limiter finds its pooled connection dropped, and
must reconnect rather than answer the next call with a 503. A Redis of the test's own (the session's serves every
other test) behind a real uvicorn web process, in front of a scripted OpenAI-compatible engine."""

import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from accounts.services import SYSTEM, Actor, create_api_key
from cluster.models import Node
from serving import services
from serving.models import Deployment, Replica, ServingState
from tests.conftest import free_port, local_http_server, platform_env, running_server, wait_for
from tests.serving.test_gateway_asgi import ScriptedEngine

pytestmark = pytest.mark.django_db(transaction=True)
RATE_PER_KEY = 3


class OwnRedis:
    """A redis-server without persistence on a port of its own, which the test may restart: SHUTDOWN, then a new
    server on the same port, empty."""

    def __init__(self, directory: Path):
        self.directory, self.port = directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def _answers(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).returncode == 0

    def start(self) -> None:
        subprocess.run(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly",
                        "no", "--daemonize", "yes", "--pidfile", str(self.directory / "redis.pid"), "--dir",
                        str(self.directory), "--logfile", str(self.directory / "redis.log")], check=True)
        wait_for(self._answers, timeout=10, what="redis to answer")

    def stop(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"], capture_output=True)
        wait_for(lambda: not self._answers(), timeout=10, what="redis to stop")

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def own_redis(tmp_path):
    redis = OwnRedis(tmp_path)
    redis.start()
    yield redis
    redis.stop()


@pytest.fixture
def engine_url(settings):
    settings.EGRESS_ALLOW = ["127.0.0.1/32"]  # the scripted engine is an external endpoint on loopback
    with local_http_server(ScriptedEngine) as port:
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def caller(make_workspace, engine_url):
    """An API key and the name of a ready deployment in its workspace, whose replica is the scripted engine."""
    workspace = make_workspace("Restarts", owner="restart-owner")
    actor = Actor(user=workspace.memberships.get().user)
    name = f"scripted-{uuid.uuid4().hex[:8]}"
    model = services.register_model(actor=SYSTEM, workspace=workspace, name=name, url=engine_url)
    deployment = services.create_deployment(actor=SYSTEM, workspace=workspace, model=model, name=name,
                                            replicas=[(Node.objects.create(name="restart-node"), 1.0)])
    Replica.objects.filter(deployment=deployment).update(state=ServingState.READY, base_url=engine_url)
    Deployment.objects.filter(pk=deployment.pk).update(state=ServingState.READY)
    return {"key": create_api_key(actor=actor, workspace=workspace, name="restarts").secret, "model": name}


@pytest.fixture
def web_on_own_redis(own_redis, caller, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**platform_env(port), "REDIS_URL": own_redis.url, "FACTORY_EGRESS_ALLOW": "127.0.0.1/32",
           "FACTORY_GATEWAY_RATE_PER_KEY": f"{RATE_PER_KEY}/minute"}
    argv = [sys.executable, "-m", "uvicorn", "factory.asgi:application", "--host", "127.0.0.1", "--port", str(port),
            "--lifespan", "off", "--no-access-log"]
    with running_server(argv, health_url=f"{url}/healthz", env=env, log=tmp_path / "web.log"):
        yield url


def _chat(url: str, caller: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {caller['key']}"},
                      json={"model": caller["model"], "messages": [{"role": "user", "content": "Hi"}],
                            "max_tokens": 2}, timeout=30)


def test_the_first_gateway_call_after_a_redis_restart_is_answered_and_the_rate_limit_still_counts(
        web_on_own_redis, own_redis, caller):
    assert _chat(web_on_own_redis, caller).status_code == 200  # the limiter's connection is now in its pool

    own_redis.restart()  # empty: the counts went with it

    answers = [_chat(web_on_own_redis, caller) for _ in range(RATE_PER_KEY + 1)]
    assert [answer.status_code for answer in answers] == [200] * RATE_PER_KEY + [429], answers[0].text
    assert answers[0].json()["choices"][0]["message"]["content"] == "tok tok "
    assert int(answers[-1].headers["retry-after"]) >= 1
