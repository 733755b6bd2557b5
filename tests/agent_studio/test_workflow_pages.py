"""The workflows' GUI pages: the list (create, open, delete), the canvas page with what its pickers offer, another
workspace's workflow as a missing page, and a viewer who sees the canvas read-only and cannot save through it."""

import json

import pytest
from django.test import Client

from accounts.services import Actor
from agent_studio.workflows import services
from agent_studio.workflows.models import Workflow
from workbridge import services as workbridge

pytestmark = pytest.mark.django_db
GRAPH = {"inputs": [{"name": "question", "type": "string"}],
         "nodes": [{"id": "start", "kind": "start"},
                   {"id": "reply", "kind": "answer", "settings": {"answer": "You asked: {{start.question}}"}}],
         "edges": [{"from": "start", "to": "reply"}]}


def _signed_in(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password="correct-horse-battery")
    return client


@pytest.fixture
def acme(make_workspace):
    return make_workspace("Acme", owner="ann", viewer="viewer")


@pytest.fixture
def flow(acme):
    owner = Actor(user=acme.memberships.get(role="owner").user)
    return services.save_workflow(actor=owner, workspace=acme, name="triage", graph=GRAPH, description="Sort tickets")


def _canvas_data(page) -> dict:
    html = page.content.decode()
    start = html.index('<script id="workflow-data" type="application/json">') + len(
        '<script id="workflow-data" type="application/json">')
    return json.loads(html[start:html.index("</script>", start)])


def test_the_list_creates_a_workflow_that_opens_on_its_canvas_and_deletes_it(acme):
    ann = _signed_in("ann")
    assert "No workflows yet" in ann.get("/workflows/").content.decode()

    created = ann.post("/workflows/", {"name": "support", "description": "Answers tickets"})

    workflow = Workflow.objects.get(name="support")
    assert created.status_code == 302 and created.url == f"/workflows/{workflow.pk}/"
    assert (workflow.version, [node["kind"] for node in workflow.graph["nodes"]]) == (1, ["start", "answer"])
    listed = ann.get("/workflows/").content.decode()
    assert f'href="/workflows/{workflow.pk}/"' in listed and "Answers tickets" in listed and "v1" in listed
    canvas = ann.get(f"/workflows/{workflow.pk}/")
    assert canvas.status_code == 200 and _canvas_data(canvas)["graph"] == workflow.graph

    taken = ann.post("/workflows/", {"name": "support"}, follow=True)
    assert "already has a workflow called &#x27;support&#x27;" in taken.content.decode()

    deleted = ann.post(f"/workflows/{workflow.pk}/delete/", follow=True)
    assert "Deleted support" in deleted.content.decode() and not Workflow.objects.filter(name="support").exists()


def test_the_canvas_offers_every_node_kind_and_the_workspace_tools_for_its_pickers(acme, flow):
    owner = Actor(user=acme.memberships.get(role="owner").user)
    workbridge.save_tool(actor=owner, workspace=acme, name="word_count", description="Count words.", binding="python",
                         config={"code": "def run(args):\n    return len(args['text'].split())\n"},
                         parameters={"type": "object", "properties": {"text": {"type": "string"}}})

    page = _signed_in("ann").get(f"/workflows/{flow.pk}/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "vendor/drawflow/drawflow.min.js" in html and "js/workflow_canvas.js" in html
    assert 'class="wf-save"' in html and 'class="wf-palette"' in html
    data = _canvas_data(page)
    assert set(data["catalogue"]["kinds"]) == {"start", "llm", "classifier", "knowledge", "tool", "code", "condition",
                                               "template", "http", "iteration", "aggregator", "agent", "answer"}
    assert data["catalogue"]["kinds"]["knowledge"]["outputs"] == ["hits", "output"]
    assert data["catalogue"]["tools"] == [{"id": acme.tools.get().pk, "name": "word_count", "parameters": ["text"]}]
    assert (data["name"], data["version"]) == ("triage", 1)


def test_another_workspace_sees_no_such_workflow(flow, make_workspace):
    make_workspace("Other", owner="zed")
    zed = _signed_in("zed")

    assert zed.get(f"/workflows/{flow.pk}/").status_code == 404
    assert zed.post(f"/workflows/{flow.pk}/delete/").status_code == 404
    assert 'data-workflow="triage"' not in zed.get("/workflows/").content.decode()
    assert Workflow.objects.filter(pk=flow.pk).exists()


def test_a_viewer_sees_the_canvas_read_only_and_cannot_save_or_delete(flow):
    viewer = _signed_in("viewer")

    page = viewer.get(f"/workflows/{flow.pk}/")

    html = page.content.decode()
    assert page.status_code == 200 and 'data-can-edit="false"' in html
    assert 'class="wf-save"' not in html and 'class="wf-palette"' not in html
    assert "saving and running it takes the developer role" in html
    assert "New workflow" not in viewer.get("/workflows/").content.decode()
    changed = {**GRAPH, "nodes": [GRAPH["nodes"][0], {**GRAPH["nodes"][1], "settings": {"answer": "Changed"}}]}
    saved = viewer.put(f"/api/workflows/{flow.pk}/", {"name": "triage", "graph": changed},
                       content_type="application/json")
    assert saved.status_code == 403, saved.json()
    assert "developer" in saved.json()["error"]["message"]
    viewer.post(f"/workflows/{flow.pk}/delete/")
    flow.refresh_from_db()
    assert (flow.version, flow.graph["nodes"][1]["settings"]["answer"]) == (1, "You asked: {{start.question}}")


def test_the_list_makes_a_workflow_from_a_template_with_the_assets_picked(acme, chat_deployment):
    from rag_studio.models import KnowledgeBase

    ann = _signed_in("ann")
    listed = ann.get("/workflows/").content.decode()
    assert 'data-template="support-triage"' in listed and 'data-template="document-review"' in listed
    assert "Extracts a contract&#x27;s counterparty" in listed
    assert f'<option value="{chat_deployment.name}">' in listed
    assert "demo tool" in listed.split('data-template="support-triage"')[1]

    refused = ann.post("/workflows/", {"template": "support-triage", "name": "Tickets",
                                       "binding-model": chat_deployment.name, "binding-knowledge_base": "424242"})

    assert refused.status_code == 400 and not Workflow.objects.exists()
    form = refused.content.decode().split('data-template="support-triage"')[1].split("</form>")[0]
    assert "there is no knowledge base 424242 in this workspace" in form
    assert 'value="Tickets"' in form and f'<option value="{chat_deployment.name}" selected>' in form
    assert not KnowledgeBase.objects.exists()

    created = ann.post("/workflows/", {"template": "document-review", "name": "Contracts",
                                       "binding-model": chat_deployment.name})

    workflow = Workflow.objects.get(name="Contracts")
    assert created.status_code == 302 and created.url == f"/workflows/{workflow.pk}/"
    assert workflow.scenarios.count() >= 1 and workflow.graph["inputs"]
    assert "Created Contracts from the template" in ann.get(created.url).content.decode()
