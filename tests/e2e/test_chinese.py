"""The GUI in Chinese, in Chromium: a user switches to 中文 in the sidebar, and every page of the RAG path and the
rest of the platform (each list page and a detail page of each kind that exists here) reads with no English sentence
left: product names, formats, code and the user's own data aside (tests/i18n/english.py). Then the choice follows
the user into a new session of another browser that asks for English.

Left out, with its reason: the messages of event logs (.log-message: written in English by the services when the
event happens, like every service message but accounts')."""

import os

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import translation
from playwright.sync_api import expect, sync_playwright

from accounts.services import SYSTEM, Actor, create_workspace
from agent_studio.workflows.services import save_workflow
from cluster import inventory
from cluster.services import register_node
from rag_studio import services as rag
from rag_studio.models import Document
from rag_studio.pipeline.ingestion import ingest
from runtime.services import publish_app
from serving import presets
from serving.models import Model
from serving.services import create_deployment, register_model
from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.i18n.english import english_sentences
from tests.rag_studio.conftest import SAMPLES, upload
from workbridge import services as workbridge

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHINESE_DOCUMENTS = ["huadong-plant-handbook.md", "huadong-maintenance-rules.docx", "huadong-shift-handover.txt"]
# Every page without an object in its address; detail pages are reached by following the first link of their kind
# on a list page.
PAGES = ["/dashboard/", "/rag/", "/rag/evals/", "/rag/configs/new/", "/agents/", "/workflows/", "/tools/",
         "/tools/new/http/", "/tools/import/openapi/", "/tools/import/curl/", "/serving/", "/serving/playground/",
         "/enhancement/", "/enhancement/jobs/new/", "/apps/", "/assets/", "/cluster/", "/keys/", "/settings/",
         "/no-such-page/"]
DETAIL_LINKS = {"/rag/": ["main a[href^='/rag/kb/']", "main a[href^='/rag/configs/']:not([href$='/new/'])"],
                "/serving/": ["main a[href^='/serving/deployments/']:not([href$='/new/'])"],
                "/apps/": ["main a[href^='/apps/'][href$='/']:not([href='/apps/'])"],
                "/tools/": ["main a[href^='/tools/'][href$='/']:not([href*='new']):not([href*='import'])"],
                "/workflows/": ["main a[href^='/workflows/'][href$='/']"]}
# What the browser shows a person, attributes people read included; event log messages and code aside.
VISIBLE_TEXT = """() => {
  for (const el of document.querySelectorAll(".log-message, pre, code")) el.remove();
  const parts = [document.title, document.body ? document.body.innerText : "(no page body)"];
  for (const el of document.querySelectorAll("[placeholder], [title], [aria-label]")) {
    for (const name of ["placeholder", "title", "aria-label"]) {
      if (el.getAttribute(name)) parts.push(el.getAttribute(name));
    }
  }
  return parts.join("\\n");
}"""


@pytest.fixture
def huadong(db):
    """A Chinese workspace with the Chinese samples ingested in this process, a config on them, an app and a tool."""
    user = get_user_model().objects.create_user(username="wang", password="correct-horse-battery")
    owner = Actor(user=user)
    workspace = create_workspace(actor=owner, name="华东化工")
    for name in (presets.MINILM, presets.SMOLLM2):
        locate, role, template = presets.PRESETS[name]
        register_model(actor=SYSTEM, workspace=None, name=name, path=str(locate()), role_hint=role,
                       chat_template=template)
    register_node(name=settings.NODE_NAME, resources=inventory.probe())
    create_deployment(actor=SYSTEM, workspace=None, model=Model.objects.get(name=presets.SMOLLM2),
                      name=presets.SMOLLM2)
    kb = rag.create_knowledge_base(actor=owner, workspace=workspace, name="一号装置手册")
    outcomes = rag.upload_documents(actor=owner, kb=kb, uploads=[upload(name, (SAMPLES / name).read_bytes())
                                                                  for name in CHINESE_DOCUMENTS])
    # No worker reads what this test dispatches (tests/conftest.py): the samples are ingested here.
    for outcome in outcomes:
        assert ingest(outcome.document.pk, "pytest") == "indexed", Document.objects.get(pk=outcome.document.pk).error
    config = rag.save_rag_config(actor=owner, workspace=workspace, name="安全问答", knowledge_base=kb,
                                 template="citations", model=presets.SMOLLM2)
    with translation.override("zh-hans"):  # published from the Chinese GUI: its first release note is Chinese
        publish_app(actor=owner, config=config, name="安全助手", slug="safety")
    save_workflow(actor=owner, workspace=workspace, name="液位问答", graph={
        "inputs": [{"name": "tank", "type": "string"}],
        "nodes": [{"id": "start", "kind": "start"},
                  {"id": "lookup", "kind": "template", "settings": {"template": "储罐 {{ start.tank }} 的液位"}},
                  {"id": "reply", "kind": "answer", "settings": {"answer": "{{lookup.output}}"}}],
        "edges": [{"from": "start", "to": "lookup"}, {"from": "lookup", "to": "reply"}]})
    workbridge.save_tool(actor=owner, workspace=workspace, name="query_tank_level", binding="http",
                         description="查询储罐液位",
                         parameters={"type": "object", "properties": {"tank": {"type": "string"}},
                                     "required": ["tank"]},
                         config={"method": "GET", "url": "https://scada.example.com/tanks/{tank}"})
    return kb


def english_on(page) -> list[str]:
    return english_sentences(page.evaluate(VISIBLE_TEXT))


def test_every_page_reads_in_chinese_and_the_choice_follows_the_user(huadong, live_server):
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        english_browser = browser.new_context(base_url=live_server.url, locale="en-US")
        page = english_browser.new_page()
        page.set_default_timeout(20_000)
        page.goto("/")
        page.get_by_label("Username").fill("wang")
        page.get_by_label("Password").fill("correct-horse-battery")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()

        page.get_by_label("Language").select_option("zh-hans")
        expect(page.get_by_role("heading", name="概览")).to_be_visible()
        expect(page.locator("html")).to_have_attribute("lang", "zh-hans")

        walked, found = [], {}
        for path in PAGES:
            page.goto(path)
            walked.append(path)
            found[path] = english_on(page)
            for selector in DETAIL_LINKS.get(path, []):
                link = page.locator(selector).first
                href = link.get_attribute("href")
                page.goto(href)
                walked.append(href)
                found[href] = english_on(page)
                page.goto(path)
        # The RAG path's own pages: a document, hit testing with a Chinese query, the evaluation page with the set.
        page.goto(f"/rag/kb/{huadong.pk}/")
        expect(page.locator("[data-field=status]").first).to_have_text("已索引")
        page.locator("a[href^='/rag/documents/']").first.click()
        page.wait_for_url("**/rag/documents/**")
        walked.append(page.url)
        found[page.url] = english_on(page)
        page.goto(f"/rag/kb/{huadong.pk}/hit-test/?query=反应釜压力超过多少要停止进料")
        expect(page.locator("body")).to_contain_text("立即停止进料")
        walked.append(page.url)
        found[page.url] = english_on(page)

        left = {path: sentences for path, sentences in found.items() if sentences}
        assert left == {}, "\n".join(f"{path}: {sentences}" for path, sentences in left.items())

        # Another browser that asks for English: after signing in, the user's choice wins.
        other = browser.new_context(base_url=live_server.url, locale="en-US").new_page()
        other.goto("/")
        expect(other.get_by_role("button", name="Sign in")).to_be_visible()
        other.get_by_label("Username").fill("wang")
        other.get_by_label("Password").fill("correct-horse-battery")
        other.get_by_role("button", name="Sign in").click()
        expect(other.get_by_role("heading", name="概览")).to_be_visible()
        browser.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
