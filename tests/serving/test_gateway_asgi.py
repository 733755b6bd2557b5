"""The gateway's lean ASGI app (serving/gateway_asgi.py), called in process, in front of a scripted OpenAI-compatible
engine on a real socket: errors in the OpenAI format, byte-for-byte relaying, failover, recording, and hang-ups."""

import asyncio
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core.signals import request_started
from django.test import AsyncClient

from accounts import deferred_writes
from accounts.services import SYSTEM, Actor, create_api_key, revoke_api_key, service_token
from cluster.models import Node
from factory.asgi import application as factory_application
from serving import gateway, services
from serving.gateway_asgi import app
from serving.groups import services as group_services
from serving.models import Deployment, GroupRequest, Replica, RequestRecord, ServingState
from serving.router import TABLE_TTL_S
from tests.conftest import free_port, local_http_server

pytestmark = pytest.mark.django_db(transaction=True)
CHUNK_INTERVAL_S = 0.02


def _sse(payload) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


class ScriptedEngine(BaseHTTPRequestHandler):
    """Answers chat completions with one content chunk per `max_tokens`, CHUNK_INTERVAL_S apart, and usage."""

    hung_up = threading.Event()
    sent: list[bytes] = []
    answered = 0

    def do_GET(self) -> None:
        self._answer(200, json.dumps({"object": "list", "data": []}).encode(), "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ScriptedEngine.answered += 1
        if body.get("refuse_with"):
            error = {"error": {"code": body["refuse_with"], "message": "scripted refusal"}}
            self._answer(body["refuse_with"], json.dumps(error).encode(), "application/json")
            return
        tokens = body.get("max_tokens") or 3
        usage = {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens}
        if not body.get("stream"):
            answer = {"id": "cmpl-1", "object": "chat.completion", "model": body["model"], "usage": usage,
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * tokens},
                                   "finish_reason": "length"}]}
            self._answer(200, json.dumps(answer).encode(), "application/json")
            return
        events = [_sse({"choices": [{"index": 0, "delta": {"content": f"tok{i} "}}]}) for i in range(tokens)]
        events += [_sse({"choices": [], "usage": usage}), _sse("[DONE]")]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(event)
                ScriptedEngine.sent.append(event)
                time.sleep(CHUNK_INTERVAL_S)
        except (BrokenPipeError, ConnectionResetError):
            ScriptedEngine.hung_up.set()

    def _answer(self, status: int, content: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def engine_url():
    with local_http_server(ScriptedEngine) as port:
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture(autouse=True)
def fresh_upstream_client(monkeypatch):
    """The gateway keeps one httpx client per process; each test runs its own event loop, which needs its own."""
    monkeypatch.setattr(gateway, "_client", None)
    monkeypatch.setattr(gateway, "_trusted_keys", {})


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    """The scripted engines are external endpoints on loopback, which the egress guard opens only when allowed."""
    settings.EGRESS_ALLOW = ["127.0.0.1/32"]
    ScriptedEngine.hung_up.clear()
    ScriptedEngine.sent.clear()
    ScriptedEngine.answered = 0


@pytest.fixture
def workspace(make_workspace):
    return make_workspace("Gateway users", owner="gw-owner")


@pytest.fixture
def api_key(workspace) -> str:
    owner = workspace.memberships.get().user
    return create_api_key(actor=Actor(user=owner), workspace=workspace, name="gw").secret


@pytest.fixture
def deploy(engine_url, workspace):
    """A ready deployment in `workspace` whose replicas answer at the given URLs (the scripted engine by default),
    as the external engine leaves them once its URL answers."""
    node = Node.objects.create(name="asgi-test-node")

    def make(replica_urls: list[tuple[str, float]] | None = None) -> Deployment:
        replica_urls = replica_urls or [(engine_url, 1.0)]
        name = f"scripted-{uuid.uuid4().hex[:8]}"
        model = services.register_model(actor=SYSTEM, workspace=workspace, name=name, url=engine_url)
        deployment = services.create_deployment(actor=SYSTEM, workspace=workspace, model=model, name=name,
                                                replicas=[(node, weight) for _, weight in replica_urls])
        for replica, (url, _) in zip(deployment.replicas.order_by("id"), replica_urls):
            Replica.objects.filter(pk=replica.pk).update(state=ServingState.READY, base_url=url)
        Deployment.objects.filter(pk=deployment.pk).update(state=ServingState.READY)
        return deployment

    return make


def _chat(model: str, *, stream: bool = True, max_tokens: int = 3) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": stream,
            "max_tokens": max_tokens}


async def _request(method: str, path: str, *, key: str | None = None, content: bytes = b"",
                   asgi_app=app) -> tuple[httpx.Response, RequestRecord | None]:
    """Send one request to the ASGI app; with an X-Request-Id, wait for its row too, which the gateway writes once
    it has answered."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app), base_url="http://testserver") as client:
        response = await client.request(method, path, content=content, headers=headers)
    request_id = response.headers.get("X-Request-Id")
    return response, request_id and await _recorded(request_id)


def _call(method: str, path: str, **options) -> tuple[httpx.Response, RequestRecord | None]:
    return asyncio.run(_request(method, path, **options))


async def _recorded(request_id: str, timeout_s: float = 10.0) -> RequestRecord:
    """The request's row, once the rows the gateway wrote after answering have reached the database."""
    assert await asyncio.to_thread(deferred_writes.flush, timeout_s), "the gateway's rows were not written"
    return await RequestRecord.objects.aget(request_id=request_id)


def _error_code(response: httpx.Response) -> str:
    error = response.json()["error"]
    assert error["message"] and error["type"] and response.headers["content-type"] == "application/json"
    return error["code"]


def test_requests_without_a_valid_key_are_refused_in_the_openai_format(api_key):
    for key in (None, "afk_123456789012.nope", "afs_1.forged", api_key + "x"):
        response, _ = _call("POST", "/v1/chat/completions", key=key, content=json.dumps(_chat("any")).encode())
        assert response.status_code == 401 and _error_code(response) == "invalid_api_key"


def test_a_revoked_key_is_refused(workspace, api_key):
    owner = workspace.memberships.get().user
    revoke_api_key(actor=Actor(user=owner), api_key=workspace.api_keys.get())

    response, _ = _call("GET", "/v1/models", key=api_key)
    assert response.status_code == 401 and "revoked" in response.json()["error"]["message"]


def test_a_key_revoked_while_in_use_stops_working_within_the_trust_window(workspace, api_key, monkeypatch):
    monkeypatch.setattr(gateway, "KEY_TRUST_S", 0.5)
    assert _call("GET", "/v1/models", key=api_key)[0].status_code == 200
    revoke_api_key(actor=Actor(user=workspace.memberships.get().user), api_key=workspace.api_keys.get())

    assert _call("GET", "/v1/models", key=api_key)[0].status_code == 200, "trusted for KEY_TRUST_S after its check"
    time.sleep(0.6)
    assert _call("GET", "/v1/models", key=api_key)[0].status_code == 401


@pytest.mark.parametrize("content, status, code", [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "missing_model"),
    (b'{"model": "m", "messages": []}', 400, "invalid_messages"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', 400, "invalid_type"),
    (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}', 404, "model_not_found"),
])
def test_malformed_requests_get_openai_errors_with_a_service_token(workspace, content, status, code):
    response, _ = _call("POST", "/v1/chat/completions", key=service_token(workspace_id=workspace.pk),
                        content=content)
    assert response.status_code == status and _error_code(response) == code


def test_unknown_routes_wrong_methods_and_oversized_bodies_get_openai_errors(api_key, settings):
    unknown, _ = _call("POST", "/v1/chat/complete", key=api_key)
    assert unknown.status_code == 404 and _error_code(unknown) == "unknown_url"
    assert "/v1/chat/complete" in unknown.json()["error"]["message"]
    wrong_method, _ = _call("GET", "/v1/embeddings", key=api_key)
    assert wrong_method.status_code == 405 and _error_code(wrong_method) == "method_not_allowed"
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    oversized, _ = _call("POST", "/v1/chat/completions", key=api_key, content=b"x" * 101)
    assert oversized.status_code == 413 and _error_code(oversized) == "request_too_large"


def test_models_lists_the_ready_deployments_and_a_stopped_one_is_409(deploy, api_key):
    ready, stopped = deploy(), deploy()
    Deployment.objects.filter(pk=stopped.pk).update(state=ServingState.STOPPED)

    listed, _ = _call("GET", "/v1/models", key=api_key)
    assert [(m["id"], m["capabilities"]) for m in listed.json()["data"]] == [(ready.name, ["chat", "completion"])]
    refused, _ = _call("POST", "/v1/chat/completions", key=api_key, content=json.dumps(_chat(stopped.name)).encode())
    assert refused.status_code == 409 and _error_code(refused) == "model_not_ready"


def test_a_deployment_stopped_while_in_use_is_refused_within_the_routing_tables_lifetime(deploy, api_key):
    deployment = deploy()
    content = json.dumps(_chat(deployment.name, stream=False)).encode()

    async def use_stop_and_use_again() -> tuple[httpx.Response, httpx.Response]:
        served, _ = await _request("POST", "/v1/chat/completions", key=api_key, content=content)
        await Deployment.objects.filter(pk=deployment.pk).aupdate(state=ServingState.STOPPED)
        await asyncio.sleep(TABLE_TTL_S * 1.5)
        refused, _ = await _request("POST", "/v1/chat/completions", key=api_key, content=content)
        return served, refused

    served, refused = asyncio.run(use_stop_and_use_again())
    assert served.status_code == 200
    assert refused.status_code == 409 and _error_code(refused) == "model_not_ready"


def _set_state(deployment: Deployment, state: str) -> None:
    Replica.objects.filter(deployment=deployment).update(state=state)
    Deployment.objects.filter(pk=deployment.pk).update(state=state)


def test_a_request_to_a_restarting_deployment_waits_for_its_replica_instead_of_failing(deploy, api_key):
    deployment = deploy()
    _set_state(deployment, ServingState.STARTING)  # its engine died and beat is starting it again
    content = json.dumps(_chat(deployment.name, stream=False)).encode()

    async def ask_while_it_restarts() -> tuple[httpx.Response, float]:
        started = time.monotonic()
        asked = asyncio.create_task(_request("POST", "/v1/chat/completions", key=api_key, content=content))
        await asyncio.sleep(TABLE_TTL_S * 2)
        assert not asked.done()
        await sync_to_async(_set_state)(deployment, ServingState.READY)
        answered, _ = await asked
        return answered, time.monotonic() - started

    answered, waited = asyncio.run(ask_while_it_restarts())
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"]
    assert waited >= TABLE_TTL_S * 2


def test_a_deployment_still_starting_after_the_wait_is_503_with_retry_after(deploy, api_key, settings):
    settings.GATEWAY_START_WAIT_S = TABLE_TTL_S * 2
    deployment = deploy()
    _set_state(deployment, ServingState.STARTING)
    refused, _ = _call("POST", "/v1/chat/completions", key=api_key,
                       content=json.dumps(_chat(deployment.name)).encode())
    assert refused.status_code == 503 and _error_code(refused) == "model_starting"
    assert int(refused.headers["Retry-After"]) > 0 and "still starting" in refused.json()["error"]["message"]


def test_a_group_whose_members_are_both_restarting_waits_for_one_instead_of_failing(deploy, api_key, workspace):
    big, small = deploy(), deploy()
    owner = Actor(user=workspace.memberships.get().user)
    group = group_services.create_group(actor=owner, workspace=workspace, name="pair", policy="cascade", big=big,
                                        small=small)
    for member in (big, small):
        _set_state(member, ServingState.STARTING)
    content = json.dumps(_chat(group.name, stream=False)).encode()

    async def ask_while_they_restart() -> httpx.Response:
        asked = asyncio.create_task(_request("POST", "/v1/chat/completions", key=api_key, content=content))
        await asyncio.sleep(TABLE_TTL_S * 2)
        assert not asked.done()
        await sync_to_async(_set_state)(small, ServingState.READY)
        answered, _ = await asked
        return answered

    answered = asyncio.run(ask_while_they_restart())
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"]
    note = GroupRequest.objects.get(request_id=answered.headers["X-Request-Id"])
    assert note.member == "small" and "big member could not answer" in note.fallback


def test_a_stream_is_relayed_byte_for_byte_and_recorded(deploy, api_key, workspace):
    deployment = deploy()

    response, record = _call("POST", "/v1/chat/completions", key=api_key,
                             content=json.dumps(_chat(deployment.name, max_tokens=4)).encode())

    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
    assert response.content == b"".join(ScriptedEngine.sent)
    assert (record.status, record.stream, record.endpoint, record.attempts) == (200, True, "chat/completions", 1)
    assert (record.deployment_id, record.workspace_id) == (deployment.pk, workspace.pk)
    assert (record.input_tokens, record.output_tokens) == (7, 4)
    assert 0 < record.ttft_ms < record.e2e_ms
    assert record.tpot_ms == pytest.approx((record.e2e_ms - record.ttft_ms) / 3)


def test_a_whole_answer_is_relayed_after_failing_over_from_a_dead_replica(deploy, api_key, engine_url):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    # The dead replica is all but always picked first, so the request has to fail over to the live one.
    deployment = deploy([(dead, 1e9), (engine_url, 1e-9)])

    response, record = _call("POST", "/v1/chat/completions", key=api_key,
                             content=json.dumps(_chat(deployment.name, stream=False)).encode())

    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "tok tok tok "
    assert (record.status, record.stream, record.attempts, record.output_tokens) == (200, False, 2, 3)


def test_an_external_endpoint_no_longer_allowed_is_not_called(deploy, api_key, settings):
    deployment = deploy()
    settings.EGRESS_ALLOW = []
    time.sleep(TABLE_TTL_S)

    response, _ = _call("POST", "/v1/chat/completions", key=api_key,
                        content=json.dumps(_chat(deployment.name, stream=False)).encode())

    assert response.status_code == 503 and _error_code(response) == "no_healthy_replica"
    assert "127.0.0.1, which is not a public address" in response.json()["error"]["message"]
    assert ScriptedEngine.sent == [] and not ScriptedEngine.answered


def test_a_feature_the_engine_lacks_501_is_the_requests_fault_and_is_not_retried(deploy, api_key, engine_url):
    deployment = deploy([(engine_url, 1.0), (engine_url, 1.0)])

    response, record = _call("POST", "/v1/chat/completions", key=api_key,
                             content=json.dumps(_chat(deployment.name, stream=False) | {"refuse_with": 501}).encode())

    assert response.status_code == 501 and response.json()["error"]["message"] == "scripted refusal"
    assert (record.status, record.attempts) == (501, 1)


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_a_client_hanging_up_mid_stream_closes_the_upstream_stream_and_is_recorded(deploy, api_key, spec_version):
    """ASGI 2.3 servers report a hang-up as http.disconnect; 2.4 servers by failing the next send."""
    deployment = deploy()
    content = json.dumps(_chat(deployment.name, max_tokens=200)).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
             "headers": [(b"authorization", f"Bearer {api_key}".encode()), (b"content-length", b"%d" % len(content))]}

    async def hang_up_after_the_first_chunk():
        first_chunk, body_sent, messages = asyncio.Event(), False, []

        async def receive():
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": content, "more_body": False}
            await first_chunk.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if first_chunk.is_set() and spec_version == "2.4":
                raise OSError("the client hung up")
            messages.append(message)
            if message.get("body"):
                first_chunk.set()

        await asyncio.wait_for(app(scope, receive, send), timeout=3)
        request_id = dict(messages[0]["headers"])[b"x-request-id"].decode()
        return messages, await _recorded(request_id)

    messages, record = asyncio.run(hang_up_after_the_first_chunk())

    assert messages[0]["status"] == 200 and all(m.get("more_body") for m in messages[1:])
    assert ScriptedEngine.hung_up.wait(timeout=5), "the engine never saw the gateway close its stream"
    assert len(ScriptedEngine.sent) < 100
    assert (record.status, record.error) == (499, "The client disconnected mid-stream.")


def test_the_web_application_sends_v1_past_django_and_the_rest_through_it():
    handled_by_django = []

    def count(sender, **kwargs) -> None:
        handled_by_django.append(sender)

    request_started.connect(count)
    try:
        gateway_answer, _ = _call("GET", "/v1/no-such-route", asgi_app=factory_application)
        assert handled_by_django == []
        django_answer, _ = _call("GET", "/api/no-such-route", asgi_app=factory_application)
    finally:
        request_started.disconnect(count)
    assert gateway_answer.status_code == 404 and _error_code(gateway_answer) == "unknown_url"
    assert django_answer.status_code == 404 and len(handled_by_django) == 1


def test_the_django_view_shares_the_core_with_the_lean_app(deploy, api_key):
    deployment = deploy()

    async def through_django() -> tuple:
        client, auth = AsyncClient(), {"Authorization": f"Bearer {api_key}"}
        unknown = await client.get("/v1/no-such-route", headers=auth)
        served = await client.post("/v1/chat/completions", data=_chat(deployment.name, stream=False),
                                   content_type="application/json", headers=auth)
        return unknown, served, await _recorded(served.headers["X-Request-Id"])

    unknown, served, record = asyncio.run(through_django())
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 3
    assert (record.status, record.stream, record.deployment_id) == (200, False, deployment.pk)
