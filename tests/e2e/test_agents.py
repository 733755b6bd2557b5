"""The Agent Studio tour in a real browser, on the real platform (SmolLM2, the Celery worker, the web server): build a
plan-and-execute agent with a Work Bridge tool and a knowledge base, chat with it, edit its plan (change, delete and
add steps) and approve it, watch the steps arrive, edit a memory variable, and publish it as an app."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from rag_studio import services as rag_services
from rag_studio.models import DocumentStatus
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush, wait_for
from tests.e2e.conftest import sign_in
from tests.rag_studio.conftest import upload
from workbridge import services as workbridge

pytestmark = [pytest.mark.browser, pytest.mark.worker]


@pytest.fixture
def platform(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        ann = get_user_model().objects.create_user(username="ann", password="correct-horse-battery")
        actor = Actor(user=ann)
        workspace = create_workspace(actor=actor, name="Acme")
        workbridge.save_tool(
            actor=actor, workspace=workspace, name="word_count", description="Count the words of a text.",
            binding="python", config={"code": "def run(args):\n    return {'words': len(args['text'].split())}\n"},
            parameters={"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
        kb = rag_services.create_knowledge_base(actor=actor, workspace=workspace, name="Handbook")
        rag_services.upload_documents(actor=actor, kb=kb, uploads=[upload(
            "leave.md", b"# Leave\n\nEvery employee gets 25 days of annual leave a year.\n")])
        wait_for(lambda: kb.documents.filter(status=DocumentStatus.INDEXED).exists(), timeout=120,
                 what="the handbook to be indexed")
        yield web_server
        stop_engines_and_flush(keep=SMOLLM2)


def test_the_agent_studio_tour(platform, open_page):
    page = open_page(platform)
    page.set_default_timeout(60_000)
    sign_in(page)

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Agent Studio").click()
    page.get_by_label("Name", exact=True).fill("planner")
    page.get_by_label("Template").select_option("plan_execute")
    page.get_by_label("Model", exact=True).select_option(SMOLLM2)
    page.get_by_role("button", name="Create", exact=True).click()
    expect(page.locator(".msg.success")).to_contain_text("Created planner from the Plan and execute template.")

    page.get_by_label("word_count").check()
    page.get_by_label("Handbook").check()
    page.get_by_label("Variable name").fill("team")
    page.locator("input[name=var_default]").fill("support")
    page.locator("input[name=max_plan_steps]").fill("2")
    page.get_by_role("button", name="Save: a new version").click()
    expect(page.locator(".msg.success")).to_contain_text("Saved planner: version 2.")
    expect(page.get_by_label("word_count")).to_be_checked()

    page.get_by_role("link", name="Debug chat").first.click()
    page.get_by_label("Message").fill("How many words are in 'red green blue'?")
    page.get_by_role("button", name="Send").click()
    editor = page.locator(".plan-editor")
    expect(editor).to_be_visible(timeout=180_000)
    expect(page.locator(".trace li[data-kind=plan]")).to_have_count(1)
    steps = editor.locator("input.plan-step")
    for extra in range(steps.count() - 1):
        editor.locator("li").last.get_by_role("button", name="Delete step").click()
    steps.first.fill("Count the words of 'red green blue' with the word_count tool")
    editor.get_by_role("button", name="Add a step").click()
    steps.last.fill("Report the number of words")
    editor.locator("li").last.get_by_role("button", name="Move up").click()
    expect(steps.first).to_have_value("Report the number of words")
    editor.locator("li").first.get_by_role("button", name="Move down").click()
    editor.get_by_role("button", name="Approve and run").click()

    expect(page.locator(".messages-log [data-role=assistant]")).to_be_visible(timeout=300_000)
    expect(page.locator(".trace li[data-kind=plan]")).to_have_count(2)
    expect(page.locator(".trace li[data-kind=model]").first).to_be_visible()
    expect(page.locator(".variables-panel [data-variable=team] input")).to_have_value("support")
    page.locator(".variables-panel [data-variable=team] input").fill("sales")
    page.locator(".variables-panel [data-variable=team]").get_by_role("button", name="Save").click()

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Apps").click()
    page.get_by_label("What the app serves").select_option(label="planner (v2)")
    page.get_by_label("Slug (in the URL)").fill("planner-app")
    page.get_by_role("button", name="Publish").click()
    expect(page.locator(".msg.success")).to_contain_text("Published 'planner' at /api/apps/planner-app/")
    expect(page.get_by_text("Open it in Agent Studio")).to_be_visible()
