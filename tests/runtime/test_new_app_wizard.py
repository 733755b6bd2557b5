"""The "create an app" wizard: from the home page's card, three documents become a published RAG assistant with its
key in one form; an agent from a template likewise; a refused form keeps what was typed and leaves nothing behind."""

import re

import pytest
from django.test import Client

from agent_studio.models import Agent
from rag_studio.models import KnowledgeBase
from runtime.models import App, AppKey
from serving.presets import SMOLLM2
from tests.rag_studio.conftest import SAMPLE_FILES, SAMPLES

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(ann, smollm2) -> Client:
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def test_three_documents_become_a_published_assistant_with_its_key(owner, acme):
    assert 'href="/new-app/"' in owner.get("/dashboard/").content.decode()
    form = owner.get("/new-app/?path=rag").content.decode()
    models = form[form.index('id="wizard-model"'):form.index("</select>", form.index('id="wizard-model"'))]
    assert 'name="files"' in form and re.findall(r'<option value="([^"]+)"', models)[0] == SMOLLM2

    files = [(SAMPLES / name).open("rb") for name in SAMPLE_FILES]
    try:
        response = owner.post("/new-app/", {"path": "rag", "name": "Northwind help", "model": SMOLLM2,
                                            "files": files}, follow=True)
    finally:
        for file in files:
            file.close()

    app = App.objects.get(workspace=acme)
    assert response.redirect_chain[-1][0] == f"/apps/{app.slug}/"
    page = response.content.decode()
    key = AppKey.objects.get(app=app)
    assert "Its API key, shown only now: " in page and key.prefix in page
    assert app.rag_config.name == "Northwind help" and app.current_release.config_version.settings["model"] == SMOLLM2
    assert sorted(app.rag_config.knowledge_base.documents.values_list("filename", flat=True)) == sorted(SAMPLE_FILES)
    assert 'id="embed-snippet"' in page


def test_an_agent_from_a_template(owner, acme):
    response = owner.post("/new-app/", {"path": "agent", "name": "helper", "template": "tool_calling",
                                        "model": SMOLLM2}, follow=True)
    app = App.objects.get(workspace=acme)
    assert app.agent.name == "helper" and "Its API key, shown only now" in response.content.decode()


def test_a_refused_form_keeps_the_name_and_leaves_nothing_behind(owner, acme):
    response = owner.post("/new-app/", {"path": "rag", "name": "Northwind help", "model": "no-such-model",
                                        "files": [(SAMPLES / SAMPLE_FILES[2]).open("rb")]})
    page = response.content.decode()
    assert response.status_code == 400 and "no-such-model" in page and 'value="Northwind help"' in page
    assert not KnowledgeBase.objects.filter(workspace=acme).exists() and not App.objects.exists()

    no_files = owner.post("/new-app/", {"path": "rag", "name": "Northwind help", "model": SMOLLM2})
    assert no_files.status_code == 400 and "Choose the documents" in no_files.content.decode()
    assert not Agent.objects.exists()
