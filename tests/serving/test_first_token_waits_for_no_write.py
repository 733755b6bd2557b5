"""No request waits on a database write it does not need (issue 49): with SQLite's write lock held by another
connection, as a worker holds it through a long write, a streamed chat through the real web process (uvicorn, as
`make run` starts it) to a fake engine process still gets its first token at once, its key's first use included;
its request record is written once the lock is released."""

import sqlite3
import time
import uuid

import httpx
import pytest
from django.db import connection

from accounts.models import ApiKey
from accounts.services import Actor, create_api_key
from bench.helpers.fake_engine import started as fake_engine_started
from cluster.models import Node
from serving.models import Deployment, Model, ModelKind, Replica, RequestRecord, ServingState
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
LOCK_HELD_S = 4.0  # four times the first token's bound: a request that waited for the lock could not pass
FIRST_TOKEN_WITHIN_S = 1.0
TOKENS = 20


@pytest.fixture
def engine_url():
    with fake_engine_started(token_delay_ms=3) as url:
        yield url


@pytest.fixture
def deployment(engine_url) -> Deployment:
    """A ready llama.cpp deployment whose replica is the fake engine, on a node no worker looks after."""
    name = f"fake-{uuid.uuid4().hex[:8]}"
    model = Model.objects.create(name=name, kind=ModelKind.GGUF, path="/dev/null", chat_template="{{ messages }}")
    deployment = Deployment.objects.create(name=name, model=model, engine="llamacpp", state=ServingState.READY)
    Replica.objects.create(deployment=deployment, node=Node.objects.create(name=f"{name}-node"),
                           state=ServingState.READY, base_url=engine_url)
    return deployment


def _first_token_s(url: str, key: str, model: str) -> tuple[float, str]:
    """Seconds from sending a streamed chat to its first content chunk, and its request id; reads it to the end."""
    body = {"model": model, "stream": True, "max_tokens": TOKENS, "messages": [{"role": "user", "content": "Hi"}]}
    sent, first = time.perf_counter(), None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if first is None and '"content":"' in line:
                first = time.perf_counter() - sent
    assert first is not None, "no content arrived"
    return first, response.headers["X-Request-Id"]


def test_a_held_write_lock_delays_neither_the_first_token_nor_the_key_check(web_server, make_workspace, deployment):
    workspace = make_workspace("Locked out", owner="locked-owner")
    owner = Actor(user=workspace.memberships.get().user)
    warm_up = create_api_key(actor=owner, workspace=workspace, name="warm-up").secret
    issued = create_api_key(actor=owner, workspace=workspace, name="fresh")
    # A web process that has just started imports torch in the background (factory/asgi.py), which slows all it
    # does for a while: first it answers promptly without the lock.
    wait_for(lambda: _first_token_s(web_server, warm_up, deployment.name)[0] < FIRST_TOKEN_WITHIN_S / 4, timeout=120,
             interval=0.5, what="the web process to stream promptly")
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # SQLite's write lock, held as a long write of a worker would
    try:
        held_since = time.monotonic()
        # The first request checks the never-used key (which stamps its last use) and leaves a row; the second
        # comes while the first one's row waits for the lock.
        waits = [_first_token_s(web_server, issued.secret, deployment.name) for _ in range(2)]
        assert all(first_s < FIRST_TOKEN_WITHIN_S for first_s, _ in waits), waits
        request_ids = [request_id for _, request_id in waits]
        assert not RequestRecord.objects.filter(request_id__in=request_ids).exists()
        time.sleep(max(0.0, LOCK_HELD_S - (time.monotonic() - held_since)))
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    wait_for(lambda: RequestRecord.objects.filter(request_id__in=request_ids).count() == 2, timeout=30,
             what="the requests' rows, once the lock is released")
    records = RequestRecord.objects.filter(request_id__in=request_ids)
    assert {(r.status, r.stream, r.output_tokens) for r in records} == {(200, True, TOKENS)}
    assert ApiKey.objects.get(pk=issued.api_key.pk).last_used_at is not None
