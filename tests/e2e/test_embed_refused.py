"""The web chat embedded on two sites in Chromium: the allowed one shows the chat; the other shows, inside the
frame, which site is not allowed and where to allow it, rather than the browser's "refused to connect"."""

import functools
from http.server import SimpleHTTPRequestHandler

import pytest
from playwright.sync_api import expect

from runtime import services
from tests.conftest import local_http_server
from tests.rag_studio.conftest import acme, ann, presets  # noqa: F401  (fixtures)
from tests.runtime.conftest import app, config, kb, smollm2  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_site_that_is_not_allowed_sees_why_in_the_frame(ann, app, live_server, open_page, tmp_path):  # noqa: F811
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    with local_http_server(handler) as port:
        services.update_app(actor=ann, app=app, allowed_origins=[f"http://localhost:{port}"])
        snippet = (f'<script src="{live_server.url}/apps/{app.slug}/embed.js" '
                   f'data-token="{app.widget_token}"></script>')
        (tmp_path / "page.html").write_text(f"<!doctype html><title>Site</title><h1>Site</h1>{snippet}")

        allowed = open_page(f"http://localhost:{port}")
        allowed.goto("/page.html")
        allowed.get_by_role("button", name="Chat").click()
        expect(allowed.frame_locator("#ai-factory-chat-frame").locator("#widget-form")).to_be_visible()

        stranger = open_page(f"http://127.0.0.1:{port}")
        stranger.goto("/page.html")
        stranger.get_by_role("button", name="Chat").click()
        frame = stranger.frame_locator("#ai-factory-chat-frame")
        expect(frame.get_by_role("heading")).to_have_text("This chat is not allowed on this site")
        expect(frame.locator("code").first).to_have_text(f"http://127.0.0.1:{port}")
        expect(frame.get_by_role("link")).to_have_attribute("href", f"{live_server.url}/apps/{app.slug}/")
        expect(frame.locator("#widget-form")).to_have_count(0)
