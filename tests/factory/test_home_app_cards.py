"""The home page shows the workspace's apps as cards: live or disabled, with their calls and errors of the last 24
hours, and a card that opens the "create an app" wizard."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runtime import services
from runtime.models import Channel, Trace, TraceStatus
from tests.rag_studio.conftest import acme, ann, presets  # noqa: F401  (fixtures)
from tests.runtime.conftest import app, config, kb, smollm2  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def card(page: str, slug: str) -> str:
    start = page.index(f'data-app="{slug}"')
    return page[start:page.index("</a>", start)]


def test_each_app_has_a_card_with_its_last_day(ann, app):  # noqa: F811
    for status, hours_ago, channel in [(TraceStatus.OK, 1, Channel.CHAT), (TraceStatus.ERROR, 2, Channel.WIDGET),
                                       (TraceStatus.OK, 3, "retrieve"), (TraceStatus.OK, 30, Channel.CHAT)]:
        trace = Trace.objects.create(app=app, release=app.current_release, channel=channel, query="q", status=status)
        Trace.objects.filter(pk=trace.pk).update(created_at=timezone.now() - timedelta(hours=hours_ago))
    client = Client()
    client.login(username="ann", password="correct-horse-battery")

    shown = card(client.get("/dashboard/").content.decode(), app.slug)

    assert "2 calls in the last 24 h" in shown and "1 error" in shown and "live" in shown
    services.update_app(actor=ann, app=app, enabled=False)
    page = client.get("/dashboard/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "最近 24 h 调用 2 次" in card(page, app.slug) and 'href="/new-app/"' in page
