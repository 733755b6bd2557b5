"""Publishing and running apps from the GUI and the management API: releases, keys, logs, feedback into eval
sets, and monitoring figures."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.errors import Conflict, Forbidden, ValidationFailed
from accounts.services import Actor
from rag_studio.models import EvalItem
from runtime import selectors, services
from runtime.models import Channel, Feedback, Trace, TraceStatus
from tests.runtime.conftest import save_config

pytestmark = pytest.mark.django_db


def signed_in(username: str) -> Client:
    client = Client()
    client.login(username=username, password="correct-horse-battery")
    return client


def test_an_app_serves_its_pinned_version_until_published_again(ann, kb, config):
    app = services.publish_app(actor=ann, config=config, name="Handbook assistant")
    assert (app.slug, app.current_release.number, app.current_release.config_version.number) == (
        "handbook-assistant", 1, 1)
    save_config(ann, kb, config=config, generation={"max_tokens": 99})
    app.refresh_from_db()
    assert app.current_release.config_version.number == 1

    services.republish(actor=ann, app=app)
    app.refresh_from_db()
    assert (app.current_release.number, app.current_release.config_version.number) == (2, 2)
    services.roll_back(actor=ann, app=app, number=1)
    app.refresh_from_db()
    assert (app.current_release.number, app.current_release.config_version.number) == (3, 1)
    assert app.current_release.note == "Rollback to release 1"

    with pytest.raises(Conflict, match="slug 'handbook-assistant' is taken"):
        services.publish_app(actor=ann, config=config, name="Handbook assistant")
    with pytest.raises(ValidationFailed, match="slug"):
        services.publish_app(actor=ann, config=config, slug="Not a slug!")
    viewer = Actor(user=kb.workspace.memberships.get(role="viewer").user)
    with pytest.raises(Forbidden):
        services.republish(actor=viewer, app=app)


def test_publish_manage_keys_and_read_logs_in_the_gui(ann, acme, config):
    client = signed_in("ann")
    page = client.post("/apps/", {"rag_config": config.pk, "name": "Handbook", "slug": "handbook"}, follow=True)
    assert page.status_code == 200 and b"Published &#x27;Handbook&#x27;" in page.content
    assert b"/api/apps/handbook/chat" in page.content and b"data-token=" in page.content

    page = client.post("/apps/handbook/", {"action": "create_key", "key_name": "intranet"}, follow=True)
    secret = re.search(r'id="issued-app-key" class="secret" readonly value="([^"]+)"', page.content.decode())[1]
    assert secret.startswith("afa_") and b"afa_" in page.content
    app = selectors.app_by_slug(workspace=acme, slug="handbook")
    client.post("/apps/handbook/", {"action": "settings", "name": "Handbook", "rate_limit": "5",
                                    "allowed_origins": "https://intranet.example\nhttp://localhost:9000"})
    app.refresh_from_db()
    assert app.default_rate_limit == 5 and app.allowed_origins == ["https://intranet.example",
                                                                   "http://localhost:9000"]
    page = client.post("/apps/handbook/", {"action": "settings", "name": "Handbook", "rate_limit": "5",
                                           "allowed_origins": "intranet.example/path"}, follow=True)
    assert b"is not an origin" in page.content

    ok = Trace.objects.create(app=app, release=app.current_release, channel=Channel.CHAT, query="Leave days?",
                              answer="Ten [1].", citations=[{"n": 1, "document": "handbook.pdf"}], latency_ms=900)
    Trace.objects.create(app=app, release=app.current_release, channel=Channel.CHAT, query="Broken?",
                         status=TraceStatus.ERROR, error="APIConnectionError: gateway down", latency_ms=5)
    Feedback.objects.create(trace=ok, rating=-1, comment="It is 25 days")
    assert b"Leave days?" in client.get("/apps/handbook/logs/").content
    down = client.get("/apps/handbook/logs/?feedback=down").content
    assert b"Leave days?" in down and b"Broken?" not in down
    errors = client.get("/apps/handbook/logs/?status=error").content
    assert b"Broken?" in errors and b"Leave days?" not in errors

    trace_page = client.get(f"/apps/handbook/logs/{ok.public_id}/")
    assert b"It is 25 days" in trace_page.content and b"Add to eval set" in trace_page.content
    client.post(f"/apps/handbook/logs/{ok.public_id}/", {"expected_answer": "25 days.",
                                                         "expected_sources": "handbook.pdf\n"})
    item = EvalItem.objects.get()
    assert (item.question, item.expected_answer, item.expected_sources) == ("Leave days?", "25 days.",
                                                                            ["handbook.pdf"])

    client.post("/apps/handbook/", {"action": "disable"})
    app.refresh_from_db()
    assert app.enabled is False
    assert signed_in("viewer").post("/apps/handbook/", {"action": "enable"}).status_code == 302
    app.refresh_from_db()
    assert app.enabled is False


def test_the_management_api_publishes_and_issues_keys(acme, config, key_client):
    api = key_client("ann", acme)
    created = api.post("/api/runtime/apps/", {"rag_config": config.pk, "slug": "handbook"}, format="json")
    assert created.status_code == 201 and created.data["release"]["config_version"] == 1
    assert created.data["endpoints"]["openai_base_url"] == "/api/apps/handbook/v1"
    key = api.post("/api/runtime/apps/handbook/keys/", {"name": "crm", "rate_limit": 30}, format="json")
    assert key.status_code == 201 and key.data["secret"].startswith("afa_") and key.data["rate_limit"] == 30
    listed = api.get("/api/runtime/apps/handbook/keys/").data
    assert "secret" not in listed[0]
    revoked = api.post(f"/api/runtime/apps/handbook/keys/{key.data['id']}/revoke/")
    assert revoked.data["revoked_at"] is not None
    assert api.patch("/api/runtime/apps/handbook/", {"enabled": False}, format="json").data["enabled"] is False
    assert api.post("/api/runtime/apps/handbook/releases/9/rollback/").status_code == 404
    assert api.post("/api/runtime/apps/handbook/publish/").data["release"]["number"] == 2


def test_monitoring_buckets_requests_errors_latency_and_feedback(ann, config):
    app = services.publish_app(actor=ann, config=config, slug="handbook")
    now = timezone.now()

    def call(minutes_ago: float, status=TraceStatus.OK, latency=1000.0, ttft=200.0, rating=None):
        trace = Trace.objects.create(app=app, release=app.current_release, channel=Channel.CHAT, query="q",
                                     status=status, latency_ms=latency, ttft_ms=ttft)
        Trace.objects.filter(pk=trace.pk).update(created_at=now - timedelta(minutes=minutes_ago))
        if rating:
            Feedback.objects.create(trace=trace, rating=rating)

    for latency in (100, 200, 300, 400):
        call(10, latency=latency, rating=1 if latency < 300 else -1)
    call(12, status=TraceStatus.ERROR, latency=5, ttft=None)
    call(60 * 30)  # outside the last 24 hours
    figures = selectors.monitoring(app=app, period="24h")
    assert len(figures["series"]) == 24 and figures["totals"] == {"requests": 5, "errors": 1, "up": 2, "down": 2}
    busy = [b for b in figures["series"] if b["requests"]]
    assert len(busy) == 1
    bucket = busy[0]
    assert (bucket["requests"], bucket["errors"], bucket["error_rate"]) == (5, 1, 0.2)
    assert bucket["latency_p50"] == 250.0 and bucket["latency_p95"] == 385.0
    assert bucket["ttft_p50"] == 200.0 and bucket["feedback_ratio"] == 0.5
    assert figures["eval"] is None
    data = signed_in("ann").get("/apps/handbook/monitoring.json?period=1h").json()
    assert data["period"] == "1h" and sum(b["requests"] for b in data["series"]) == 5


def test_the_app_page_says_what_the_web_chat_token_does_and_does_not_protect(app):
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    note = client.get("/apps/handbook/").content.decode()
    assert "The web chat token is public" in note and "does not keep out a script" in note
