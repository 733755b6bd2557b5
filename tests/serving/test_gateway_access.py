"""Issue 13, hole 6: the gateway refuses what REST refuses. A removed member's keys stop working, a viewer's key
lists models but spends no compute, and every key and workspace has a sliding-window rate limit (429 with
Retry-After)."""

import asyncio
import json

import httpx
import pytest

from accounts.models import Membership
from accounts.services import Actor, create_api_key, remove_member, service_token
from factory.asgi import application
from serving import gateway

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture(autouse=True)
def fresh_gateway(monkeypatch):
    monkeypatch.setattr(gateway, "_trusted_keys", {})
    from django.core.cache import cache
    cache.clear()  # the rate limiters' counters live in the same Redis database


def _call(path: str, key: str, *, method: str = "POST", content: bytes = CHAT) -> httpx.Response:
    async def send():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application),
                                     base_url="http://testserver") as client:
            return await client.request(method, path, content=content if method == "POST" else None,
                                        headers={"Authorization": f"Bearer {key}"})

    return asyncio.run(send())


@pytest.fixture
def acme(make_workspace):
    return make_workspace("Acme", owner="ann", bob="developer")


def _key(workspace, username: str, role: str = "developer") -> str:
    user = workspace.memberships.get(user__username=username).user
    return create_api_key(actor=Actor(user=user), workspace=workspace, name=f"{username}-key", role=role).secret


def test_a_removed_members_key_is_refused_by_the_gateway_and_the_api(acme):
    key = _key(acme, "bob")
    assert _call("/v1/chat/completions", key).status_code == 404  # admitted: the model does not exist
    owner = Actor(user=acme.memberships.get(role="owner").user)
    remove_member(actor=owner, membership=Membership.objects.get(workspace=acme, user__username="bob"))
    gateway._trusted_keys.clear()  # a key checked within KEY_TRUST_S is trusted that long

    refused = _call("/v1/chat/completions", key)
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    assert _call("/v1/models", key, method="GET").status_code == 401


def test_a_viewers_key_lists_the_models_but_spends_no_compute(acme):
    key = _key(acme, "ann", role="viewer")
    assert _call("/v1/models", key, method="GET").status_code == 200
    refused = _call("/v1/chat/completions", key)
    assert refused.status_code == 403 and "needs the developer role" in refused.json()["error"]["message"]


def test_each_key_and_each_workspace_has_a_rate_limit(acme, settings):
    settings.GATEWAY_RATE_PER_KEY = "2/minute"
    settings.GATEWAY_RATE_PER_WORKSPACE = "3/minute"
    first, second = _key(acme, "ann"), _key(acme, "bob")

    answers = [_call("/v1/chat/completions", first).status_code for _ in range(3)]
    assert answers == [404, 404, 429]
    limited = _call("/v1/chat/completions", first)
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert "2 requests per minute" in limited.json()["error"]["message"]

    assert _call("/v1/chat/completions", second).status_code == 404  # its own key's window, the workspace's third
    refused = _call("/v1/chat/completions", second)
    assert refused.status_code == 429 and "this workspace" in refused.json()["error"]["message"]
    platform = _call("/v1/chat/completions", service_token(workspace_id=acme.pk))
    assert platform.status_code == 429  # the platform's own calls for the workspace count against it too


def test_a_stale_or_forged_service_token_is_refused(acme):
    stale = service_token(workspace_id=acme.pk, ttl_s=-1)
    refused = _call("/v1/chat/completions", stale)
    assert refused.status_code == 401 and "expired" in refused.json()["error"]["message"]
    workspace_id, expires, signature = stale.removeprefix("afs_").split(".")
    forged = f"afs_{workspace_id}.{int(expires) + 10**6}.{signature}"
    assert _call("/v1/chat/completions", forged).status_code == 401
    assert _call("/v1/chat/completions", service_token(workspace_id=acme.pk)).status_code == 404
