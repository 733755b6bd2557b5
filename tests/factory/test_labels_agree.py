"""Issue 48: wherever an app or a change is named, the words agree. The home page, the Apps page and the app's own
page name an app's kind with one label (a RAG assistant, an agent, a workflow), in English and in Chinese; the
home page's "Recent changes" and the settings' audit log say what changed in words, never as the stored code."""

import re

import pytest
from django.test import Client

from agent_studio import services as agent_services
from agent_studio.workflows.services import save_workflow
from rag_studio import services as rag_services
from runtime import services
from serving.presets import SMOLLM2
from tests.rag_studio.conftest import acme, ann, presets, upload  # noqa: F401  (fixtures)
from tests.runtime.conftest import app, config, kb, smollm2  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db
GRAPH = {"inputs": [{"name": "question", "type": "string", "required": True}],
         "nodes": [{"id": "start", "kind": "start"},
                   {"id": "answer", "kind": "answer", "settings": {"answer": "{{start.question}}"}}],
         "edges": [{"from": "start", "to": "answer"}]}
KINDS = {"en": {"handbook": "RAG assistant", "helper": "Agent", "echo": "Workflow"},
         "zh-hans": {"handbook": "RAG 助手", "helper": "智能体", "echo": "工作流"}}


def _kind_shown(page: str, slug: str) -> str:
    """The kind named in the card or row of the app `slug` (its data-app element)."""
    start = page.index(f'data-app="{slug}"')
    return re.search(r'data-field="kind">([^<]+)<', page[start:]).group(1)


@pytest.fixture
def three_apps(ann, app):  # noqa: F811
    agent = agent_services.save_agent(actor=ann, workspace=app.workspace, name="helper", template="tool_calling",
                                      settings={"model": SMOLLM2})
    workflow = save_workflow(actor=ann, workspace=app.workspace, name="echo", graph=GRAPH)
    services.publish_app(actor=ann, agent=agent, slug="helper")
    services.publish_app(actor=ann, workflow=workflow, slug="echo")


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_an_apps_kind_has_one_name_on_every_page(three_apps, language):
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.login(username="ann", password="correct-horse-battery")
    home = client.get("/dashboard/").content.decode()
    apps = client.get("/apps/").content.decode()

    for slug, label in KINDS[language].items():
        own = client.get(f"/apps/{slug}/").content.decode()
        assert _kind_shown(home, slug) == _kind_shown(apps, slug) == label
        assert f'<span data-field="kind">{label}</span>' in own


def test_recent_changes_and_the_audit_log_say_what_changed_in_words(ann, kb):  # noqa: F811
    rag_services.upload_documents(actor=ann, kb=kb, uploads=[upload("leave.txt", b"Annual leave is 25 days.")])
    client = Client()
    client.login(username="ann", password="correct-horse-battery")

    for language, words in (("en", "Uploaded documents"), ("zh-hans", "上传了文档")):
        home = client.get("/dashboard/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
        recent = home[home.index("<h2>", home.index('class="tiles"')):]
        assert f'data-action="rag.document.upload">{words}</td>' in recent
        assert ">rag.document.upload<" not in recent and ">rag.kb.create<" not in recent
    audit = client.get("/settings/").content.decode()
    assert 'data-action="rag.document.upload">Uploaded documents <code class="small">rag.document.upload</code>' \
        in audit
