"""Issue 48, in Chromium at 1440×900: the wizard's indexing step redraws each document's place in line as the line
moves, without reloading; a key shown once is copied by its Copy button where the page has no Clipboard API (plain
HTTP on a LAN); the workflow templates are in view without scrolling."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from rag_studio.models import Document, DocumentStatus
from rag_studio.pipeline import line
from runtime.services import start_rag_assistant
from serving.presets import SMOLLM2
from tests.e2e.conftest import sign_in
from tests.rag_studio.conftest import presets, upload  # noqa: F401  (fixtures)
from tests.runtime.conftest import smollm2  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# What a page served over plain HTTP to another machine has: no Clipboard API. Each copy the page makes is recorded.
NO_CLIPBOARD = """
Object.defineProperty(Navigator.prototype, "clipboard", { get: () => undefined });
document.addEventListener("copy", () => { window.copiedText = String(document.getSelection()); });
"""


@pytest.fixture
def owner(smollm2):  # noqa: F811
    user = get_user_model().objects.create_user(username="ann", password="correct-horse-battery")
    return Actor(user=user), create_workspace(actor=Actor(user=user), name="Acme")


@pytest.fixture
def page(browser_page):
    browser_page.set_viewport_size({"width": 1440, "height": 900})
    return browser_page


def test_the_wizard_redraws_the_place_in_line_as_the_line_moves(owner, page):
    actor, workspace = owner
    line.queues.broker().delete(line.SERVED)
    config = start_rag_assistant(actor=actor, workspace=workspace, name="Northwind help", model=SMOLLM2,
                                 uploads=[upload(f"note-{n}.txt", f"Note {n}: the pump was serviced.".encode())
                                          for n in range(2)])
    first, second = Document.objects.filter(knowledge_base=config.knowledge_base).order_by("pk")
    sign_in(page)
    page.goto(f"/new-app/rag/{config.pk}/")
    page.evaluate("window.sameLoad = true")
    place = page.locator(f"tr[data-document='{second.pk}'] [data-field=queue]")
    expect(place).to_contain_text("#2 in line")
    expect(place).to_contain_text("1 of yours ahead")

    Document.objects.filter(pk=first.pk).update(status=DocumentStatus.INDEXED, progress=100)

    expect(place).to_contain_text("#1 in line")
    expect(page.locator(f"tr[data-document='{first.pk}'] [data-field=status]")).to_have_text("indexed")
    expect(page.locator("#wizard-ready")).to_contain_text("1 of 2 documents indexed")
    assert page.evaluate("window.sameLoad") is True, "the figures are redrawn in place, not by reloading"
    # Indexing has ended: the page reloads once, to offer Publish.
    Document.objects.filter(pk=second.pk).update(status=DocumentStatus.INDEXED, progress=100)
    expect(page.get_by_role("button", name="Publish the assistant")).to_be_visible()


def test_a_key_shown_once_is_copied_without_the_clipboard_api(owner, page):
    page.add_init_script(NO_CLIPBOARD)
    sign_in(page)
    page.goto("/keys/")
    page.get_by_label("Name").fill("intranet-bot")
    page.get_by_role("button", name="Create key").click()
    secret = page.get_by_label("New API key").input_value()

    page.get_by_role("button", name="Copy").click()

    expect(page.locator("[data-copied]")).to_have_text("Copied")
    assert page.evaluate("window.copiedText") == secret


def test_the_workflow_templates_are_in_view_without_scrolling(owner, page):
    sign_in(page)
    page.goto("/workflows/")

    for form in page.locator(".workflow-templates form").all():
        box = form.get_by_role("button").bounding_box()
        assert box["y"] + box["height"] <= 900, form.get_attribute("data-template") or form.get_attribute("id")
