"""The "create an app" wizard: from the home page's card, uploaded documents become a RAG assistant, published with
its key once the wizard's indexing step has shown them indexed (a document that fails is named, and nothing is
published with no document indexed); an agent from a template is published with its key in one form; a refused
form keeps what was typed and leaves nothing behind."""

import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from agent_studio.models import Agent
from rag_studio.models import KnowledgeBase
from rag_studio.pipeline.ingestion import ingest
from runtime.models import App, AppKey
from serving.presets import SMOLLM2
from tests.rag_studio.conftest import SAMPLE_FILES, SAMPLES

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(ann, smollm2) -> Client:
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def _indexing_step(owner, files: list[tuple[str, bytes]]) -> str:
    """Post the wizard's RAG form with `files` (name, content); the URL of the indexing step it leads to."""
    uploads = [SimpleUploadedFile(name, content) for name, content in files]
    response = owner.post("/new-app/", {"path": "rag", "name": "Northwind help", "model": SMOLLM2, "files": uploads})
    assert response.status_code == 302, response.content.decode()
    return response["Location"]


def _ingest_all(kb) -> None:
    for document in kb.documents.all():
        ingest(document.pk, "pytest")


def test_documents_are_indexed_before_the_assistant_is_published_with_its_key(owner, acme):
    assert 'href="/new-app/"' in owner.get("/dashboard/").content.decode()
    form = owner.get("/new-app/?path=rag").content.decode()
    models = form[form.index('id="wizard-model"'):form.index("</select>", form.index('id="wizard-model"'))]
    assert 'name="files"' in form and re.findall(r'<option value="([^"]+)"', models)[0] == SMOLLM2

    step = _indexing_step(owner, [*((name, (SAMPLES / name).read_bytes()) for name in SAMPLE_FILES[1:]),
                                  ("scan.pdf", b"%PDF-1.4 not really a PDF")])
    waiting = owner.get(step).content.decode()
    assert "0 of 3 documents indexed" in waiting and 'data-busy="1"' in waiting
    # The page polls its knowledge base's progress (rag.js redraws each row's place in line from it).
    kb_id = KnowledgeBase.objects.get(workspace=acme).pk
    assert f'data-url="/rag/kb/{kb_id}/progress/"' in waiting and waiting.count('data-field="queue"') == 3
    assert 'id="wizard-publish"' not in waiting and not App.objects.exists()
    early = owner.post(step)
    assert early.status_code == 409 and "3 of 3 documents are still being indexed" in early.content.decode()
    assert not App.objects.exists()

    kb = KnowledgeBase.objects.get(workspace=acme)
    _ingest_all(kb)
    done = owner.get(step).content.decode()
    assert "2 of 3 documents indexed" in done and 'data-busy' not in done
    failed_row = done[done.index("scan.pdf"):done.index("</tr>", done.index("scan.pdf"))]
    assert "failed" in failed_row.lower() and 'class="error-text small"' in failed_row
    assert "1 document could not be indexed" in done

    response = owner.post(step, follow=True)
    app = App.objects.get(workspace=acme)
    assert response.redirect_chain[-1][0] == f"/apps/{app.slug}/"
    page = response.content.decode()
    key = AppKey.objects.get(app=app)
    issued = page[page.index('id="issued-key"'):page.index("</div>", page.index('id="issued-key"'))]
    # The key, once, in a field with a Copy button; the page shown again has forgotten it.
    assert "shown only now" in issued and f'value="afa_{key.prefix}' in issued
    assert 'data-copy="issued-app-key"' in issued
    assert 'id="issued-key"' not in owner.get(f"/apps/{app.slug}/").content.decode()
    assert app.rag_config.name == "Northwind help" and app.current_release.config_version.settings["model"] == SMOLLM2
    assert app.rag_config.knowledge_base == kb and 'id="embed-snippet"' in page
    # The step is done: coming back to it goes to the app, never publishes a second one.
    assert owner.get(step)["Location"] == f"/apps/{app.slug}/" and App.objects.count() == 1


def test_an_assistant_with_nothing_indexed_is_not_published(owner, acme):
    step = _indexing_step(owner, [("scan.pdf", b"%PDF-1.4 not really a PDF")])
    _ingest_all(KnowledgeBase.objects.get(workspace=acme))
    page = owner.get(step).content.decode()
    assert "0 of 1 document indexed" in page and 'id="wizard-publish"' not in page
    refused = owner.post(step)
    assert refused.status_code == 409 and "None of the documents could be indexed" in refused.content.decode()
    assert not App.objects.exists()


def test_the_indexing_step_in_chinese(owner, acme):
    step = _indexing_step(owner, [("faq.md", (SAMPLES / SAMPLE_FILES[2]).read_bytes())])
    page = owner.get(step, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "已索引 0 / 1 个文档" in page and "发布" in page


def test_an_agent_from_a_template(owner, acme):
    response = owner.post("/new-app/", {"path": "agent", "name": "helper", "template": "tool_calling",
                                        "model": SMOLLM2}, follow=True)
    app = App.objects.get(workspace=acme)
    assert app.agent.name == "helper" and 'data-copy="issued-app-key"' in response.content.decode()


def test_a_refused_form_keeps_the_name_and_leaves_nothing_behind(owner, acme):
    response = owner.post("/new-app/", {"path": "rag", "name": "Northwind help", "model": "no-such-model",
                                        "files": [(SAMPLES / SAMPLE_FILES[2]).open("rb")]})
    page = response.content.decode()
    assert response.status_code == 400 and "no-such-model" in page and 'value="Northwind help"' in page
    assert not KnowledgeBase.objects.filter(workspace=acme).exists() and not App.objects.exists()

    no_files = owner.post("/new-app/", {"path": "rag", "name": "Northwind help", "model": SMOLLM2})
    assert no_files.status_code == 400 and "Choose the documents" in no_files.content.decode()
    assert not Agent.objects.exists()
