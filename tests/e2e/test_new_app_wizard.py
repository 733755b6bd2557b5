"""The first hour of a Dify user, in Chromium: from the home page, three documents become a published RAG assistant
and a working web chat in five steps (the home page's card, the RAG path, the form, Publish once the indexing step
shows every document indexed, the web chat), with the real Celery worker indexing and SmolLM2 answering."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from runtime.models import App
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush
from tests.e2e.conftest import sign_in
from tests.rag_studio.conftest import SAMPLE_FILES, SAMPLES

pytestmark = [pytest.mark.browser, pytest.mark.worker]


@pytest.fixture
def platform(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        ann = Actor(user=get_user_model().objects.create_user(username="ann", password="correct-horse-battery"))
        create_workspace(actor=ann, name="Acme")
        yield web_server
        stop_engines_and_flush(keep=SMOLLM2)


@pytest.mark.timeout(900)
def test_three_documents_to_a_published_assistant_and_its_web_chat_in_five_steps(platform, open_page, live_db):
    page = open_page(platform)
    page.set_default_timeout(30_000)
    sign_in(page)
    page.goto("/dashboard/")

    page.get_by_role("link", name="Create an app").first.click()  # 1: the home page's card
    page.get_by_role("link", name="RAG assistant from documents").click()  # 2: the path
    page.locator("#wizard-name").fill("Northwind help")  # 3: name, documents, model
    page.get_by_label("Documents (PDF, Word, Markdown, text, HTML, CSV…)").set_input_files(
        [str(SAMPLES / name) for name in SAMPLE_FILES])
    page.get_by_role("button", name="Upload and index").click()

    # The indexing step: every document listed with its progress, Publish only once indexing has ended.
    expect(page.locator("#wizard-documents tbody tr")).to_have_count(3)
    publish = page.get_by_role("button", name="Publish the assistant")
    expect(publish).to_be_visible(timeout=240_000)  # the page reloads itself until then
    expect(page.locator("#wizard-ready")).to_contain_text("3 of 3 documents indexed")
    assert not App.objects.exists(), "nothing is published before the documents are indexed"
    publish.click()  # 4: publish

    expect(page.locator("#issued-key")).to_contain_text("shown only now")
    app = App.objects.get()
    page.goto(f"/apps/{app.slug}/widget?token={app.widget_token}")  # 5: the web chat, as embedded
    page.get_by_placeholder("Ask a question").fill("How many days of annual leave do employees get?")
    page.get_by_role("button", name="Send").click()
    # The answer streams in (its sources follow when it is done: minutes for SmolLM2 on a loaded 2-core machine).
    expect(page.locator(".turn.assistant").last).not_to_be_empty(timeout=180_000)
