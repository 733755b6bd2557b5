"""Issue 13, holes 6 and 8: removing a member revokes their keys; sign-in attempts are throttled per user name and
per address."""

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import ApiKey, Membership
from accounts.services import Actor, create_api_key, remove_member

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_limits():
    cache.clear()  # the rate limiters' counters live in the same Redis database


def test_removing_a_member_revokes_their_keys_in_that_workspace(make_workspace):
    acme = make_workspace("Acme", owner="ann", bob="developer")
    bob = acme.memberships.get(user__username="bob").user
    elsewhere = make_workspace("Bob's own", owner="carl")
    Membership.objects.create(workspace=elsewhere, user=bob, role="developer")
    acme_key = create_api_key(actor=Actor(user=bob), workspace=acme, name="acme").secret
    own_key = create_api_key(actor=Actor(user=bob), workspace=elsewhere, name="own").secret
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {acme_key}")
    assert client.get("/api/auth/me/").status_code == 200

    remove_member(actor=Actor(user=acme.memberships.get(role="owner").user),
                  membership=Membership.objects.get(workspace=acme, user=bob))

    refused = client.get("/api/auth/me/")
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    assert ApiKey.objects.get(prefix=own_key[4:16]).revoked_at is None


def test_failed_sign_ins_are_throttled_per_user_name_and_per_address(make_user, settings):
    settings.LOGIN_RATE = "3 per 15 minutes"
    make_user("ann")
    page = Client()
    for _ in range(3):
        assert page.post("/login/", {"username": "ann", "password": "wrong"}).status_code == 200
    refused = page.post("/login/", {"username": "ann", "password": "correct-horse-battery"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "Rate limit" in refused.content.decode()

    api = APIClient()
    answer = api.post("/api/auth/login/", {"username": "ann", "password": "correct-horse-battery"}, format="json")
    assert answer.status_code == 429 and int(answer["Retry-After"]) >= 1
    same_address = api.post("/api/auth/login/", {"username": "someone-else", "password": "x"}, format="json")
    assert same_address.status_code == 429 and "this address" in same_address.json()["error"]["message"]
    elsewhere = APIClient(REMOTE_ADDR="198.51.100.4")
    assert elsewhere.post("/api/auth/login/", {"username": "someone-else", "password": "x"},
                          format="json").status_code == 401
