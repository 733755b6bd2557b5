"""Publishing in a real browser, and the web chat embedded in a page of another site (another origin): it streams
an answer with its sources and takes a thumbs down, which the app's log then shows. A site that is not on the
app's list cannot frame it."""

import functools
from http.server import SimpleHTTPRequestHandler

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from rag_studio import services as rag_services
from rag_studio.models import DocumentStatus
from runtime.models import Feedback
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, local_http_server, stop_engines_and_flush, wait_for
from tests.e2e.conftest import sign_in
from tests.rag_studio.conftest import SAMPLE_FILES, sample

pytestmark = [pytest.mark.browser, pytest.mark.worker]


@pytest.fixture
def platform(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        ann = Actor(user=get_user_model().objects.create_user(username="ann", password="correct-horse-battery"))
        workspace = create_workspace(actor=ann, name="Acme")
        kb = rag_services.create_knowledge_base(actor=ann, workspace=workspace, name="Northwind")
        rag_services.upload_documents(actor=ann, kb=kb, uploads=[sample(n) for n in SAMPLE_FILES])
        wait_for(lambda: kb.documents.filter(status=DocumentStatus.INDEXED).count() == 3, timeout=120,
                 what="the worker to index the samples")
        rag_services.save_rag_config(actor=ann, workspace=workspace, name="Handbook", knowledge_base=kb,
                                     template="citations", model=SMOLLM2, generation={"max_tokens": 40})
        yield web_server
        stop_engines_and_flush(keep=SMOLLM2)


@pytest.fixture
def other_site(tmp_path):
    """Another site: a static page server on its own port, reached as http://localhost:<port>."""
    with local_http_server(functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))) as port:
        yield tmp_path, port


def test_publish_then_chat_through_the_widget_embedded_on_another_site(platform, other_site, open_page, live_db):
    folder, port = other_site
    page = open_page(platform)
    page.set_default_timeout(30_000)
    sign_in(page)
    page.get_by_role("link", name="Apps").click()
    page.get_by_label("What the app serves").select_option(label="Handbook (v1)")
    page.get_by_label("Slug (in the URL)").fill("handbook")
    page.get_by_role("button", name="Publish").click()
    expect(page.locator(".msg.success")).to_contain_text("Published 'Handbook'")
    page.get_by_label("Sites allowed to embed the web chat (one origin per line)").fill(f"http://localhost:{port}")
    page.get_by_label("Web chat opener").fill("Hello! Ask me about Northwind's policies.")
    page.get_by_label("Suggested questions").fill(
        "How many days of annual leave do employees get?\nWho approves leave?")
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator(".msg.success")).to_have_text("Saved.")
    snippet = page.locator("#embed-snippet").inner_text()
    assert f"{platform}/apps/handbook/embed.js" in snippet
    (folder / "intranet.html").write_text(f"<!doctype html><title>Intranet</title><h1>Intranet</h1>{snippet}")

    intranet = open_page(f"http://localhost:{port}")
    intranet.goto("/intranet.html")
    intranet.get_by_role("button", name="Chat").click()
    chat = intranet.frame_locator("#ai-factory-chat-frame")
    expect(chat.locator(".turn.opener")).to_have_text("Hello! Ask me about Northwind's policies.")
    chat.get_by_role("button", name="How many days of annual leave do employees get?").click()
    expect(chat.locator(".suggestion")).to_have_count(0)
    expect(chat.locator(".sources li").first).to_contain_text("northwind-", timeout=90_000)
    answer = chat.locator(".turn.assistant:not(.opener)").first
    expect(answer).not_to_be_empty()
    chat.get_by_role("button", name="Thumbs down").click()
    expect(chat.get_by_role("button", name="Thumbs down")).to_have_attribute("aria-pressed", "true")
    chat.get_by_label("What was wrong? (optional)").fill("It did not say who approves.")
    chat.get_by_role("button", name="Send feedback").click()
    expect(chat.locator(".feedback-thanks")).to_be_visible()
    feedback = Feedback.objects.select_related("trace").get()
    assert feedback.rating == -1 and feedback.trace.channel == "widget"
    assert feedback.comment == "It did not say who approves."

    page.goto("/apps/handbook/logs/?feedback=down")
    row = page.locator(f"tr[data-trace='{feedback.trace.public_id}']")
    expect(row).to_contain_text("How many days of annual leave")
    expect(row.locator("[data-field=feedback]")).to_have_text("“It did not say who approves.”")
    expect(row.locator("[data-field=feedback] [data-rating=down] svg")).to_be_visible()

    # The same page served from an origin the app does not list: the browser refuses to frame the chat.
    stranger = open_page(f"http://127.0.0.1:{port}")
    stranger.goto("/intranet.html")
    stranger.get_by_role("button", name="Chat").click()
    expect(stranger.frame_locator("#ai-factory-chat-frame").locator("#widget-form")).to_have_count(0)
