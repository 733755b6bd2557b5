"""Issue 13, hole 5: one edge in front of everything. The lean paths (/v1/, /api/apps/, /mcp) check the Host and
send security headers like Django's pages; bodies are counted as they arrive, an endless chunked body stops at the
limit, and the gateway and the apps' API authenticate before they read a byte of it. Django's own paths are capped
too."""

import asyncio

import httpx
import pytest

from accounts.services import Actor, create_api_key
from factory.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)
MIB = b"x" * 2**20


class EndlessBody:
    """A chunked request body of 1 MiB chunks that never ends; counts what the server pulled."""

    def __init__(self):
        self.sent = 0

    async def __aiter__(self):
        while True:
            self.sent += 1
            yield MIB


def _send(method: str, path: str, *, content=None, headers: dict | None = None, host: str = "testserver"):
    async def send():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application),
                                     base_url=f"http://{host}") as client:
            return await client.request(method, path, content=content, headers=headers or {})

    return asyncio.run(send())


@pytest.fixture
def api_key(make_workspace) -> str:
    workspace = make_workspace("Acme", owner="ann")
    return create_api_key(actor=Actor(user=workspace.memberships.get().user), workspace=workspace, name="k").secret


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/apps/handbook/chat"])
def test_an_endless_body_without_credentials_is_refused_before_it_is_read(path):
    body = EndlessBody()
    response = _send("POST", path, content=body)
    assert response.status_code in (401, 404)
    assert body.sent <= 1


def test_an_endless_body_with_a_valid_key_stops_at_the_limit(api_key, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 3 * 2**20
    body = EndlessBody()
    response = _send("POST", "/v1/chat/completions", content=body, headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert body.sent <= 5


def test_an_endless_body_on_a_django_path_stops_at_the_limit(api_key, settings):
    settings.MAX_REQUEST_BYTES = 3 * 2**20
    body = EndlessBody()
    response = _send("POST", "/api/assets/import/", content=body, headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 413 and "FACTORY_MAX_REQUEST_BYTES" in response.json()["error"]["message"]
    assert body.sent <= 5
    declared = _send("POST", "/api/assets/import/", content=b"x" * 10, headers={"Content-Length": str(2**40)})
    assert declared.status_code == 413


@pytest.mark.parametrize("path", ["/v1/models", "/api/apps/handbook/v1/models", "/mcp"])
def test_the_lean_paths_check_the_host_and_send_security_headers(path, api_key, settings):
    settings.ALLOWED_HOSTS = ["factory.example"]
    refused = _send("GET", path, headers={"Authorization": f"Bearer {api_key}"}, host="evil.example")
    assert refused.status_code == 400 and refused.text == "Invalid host header"

    answered = _send("GET", path, headers={"Authorization": f"Bearer {api_key}"}, host="factory.example")
    assert answered.status_code != 400
    assert answered.headers["X-Content-Type-Options"] == "nosniff"
    assert answered.headers["X-Frame-Options"] == "DENY"
    assert answered.headers["Referrer-Policy"] == "same-origin"
    assert "frame-ancestors 'none'" in answered.headers["Content-Security-Policy"]
