"""A web chat framed by a site the app does not allow explains why, in a page any site may frame, instead of the
browser's bare "refused to connect"; allowed sites and a link opened in its own tab get the chat."""

import pytest
from django.test import Client

from runtime import services

pytestmark = pytest.mark.django_db
INTRANET = "https://intranet.example.com"


@pytest.fixture
def widget_url(ann, app) -> str:
    services.update_app(actor=ann, app=app, allowed_origins=[INTRANET])
    app.refresh_from_db()
    return f"/apps/{app.slug}/widget?token={app.widget_token}"


def test_a_site_that_is_not_allowed_is_told_why_and_where_to_allow_it(widget_url, app):
    response = Client().get(widget_url, HTTP_SEC_FETCH_DEST="iframe", HTTP_REFERER="https://blog.example.org/post/1")

    page = response.content.decode()
    assert response.status_code == 403
    assert response["Content-Security-Policy"] == "frame-ancestors *"
    assert "This chat is not allowed on this site" in page and "<code>https://blog.example.org</code>" in page
    assert f"http://testserver/apps/{app.slug}/" in page and "Sites allowed to embed the web chat" in page
    assert app.widget_token not in page and 'id="widget-form"' not in page


def test_embed_js_names_the_site_when_the_referrer_is_withheld(widget_url):
    response = Client().get(f"{widget_url}&site=https://blog.example.org", HTTP_SEC_FETCH_DEST="iframe")
    assert response.status_code == 403 and "<code>https://blog.example.org</code>" in response.content.decode()


@pytest.mark.parametrize("headers", [
    {"HTTP_SEC_FETCH_DEST": "iframe", "HTTP_REFERER": f"{INTRANET}/wiki"},  # an allowed site
    {"HTTP_SEC_FETCH_DEST": "iframe", "HTTP_REFERER": "http://testserver/apps/"},  # the platform itself
    {"HTTP_SEC_FETCH_DEST": "document", "HTTP_REFERER": "https://mail.example.org/"},  # a link, not an embed
])
def test_the_chat_itself_is_served_where_it_may_show(widget_url, headers):
    response = Client().get(widget_url, **headers)
    assert response.status_code == 200 and 'id="widget-form"' in response.content.decode()
    assert response["Content-Security-Policy"] == f"frame-ancestors 'self' {INTRANET}"


def test_the_refusal_page_is_chinese_for_a_chinese_browser(widget_url):
    page = Client().get(widget_url, HTTP_SEC_FETCH_DEST="iframe", HTTP_REFERER="https://blog.example.org/",
                        HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "此站点不允许嵌入该对话" in page and "允许嵌入网页对话的站点" in page
