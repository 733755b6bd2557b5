"""The Playground opened with a deployment to compare with (the link on a fine-tune job's page): both chosen, and a
second answer pane beside the first."""

import pytest
from django.test import Client

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from serving.models import Deployment, ServingState
from serving.presets import GEMMA3, SMOLLM2, register_presets
from serving.services import create_deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def page(make_workspace) -> Client:
    make_workspace("Acme", owner="ann")
    node = register_node(name="box", resources=inventory.probe())
    models = register_presets(lambda line: None)
    for name in (SMOLLM2, GEMMA3):
        create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name, replicas=[(node, 1.0)])
    # Ready as a started replica would make them; no engine runs in this test.
    Deployment.objects.update(state=ServingState.READY)
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def test_the_compare_link_opens_both_deployments_side_by_side(page):
    shown = page.get(f"/serving/playground/?deployment={GEMMA3}&compare={SMOLLM2}").content.decode()

    compare = shown[shown.index('id="pg-compare"'):shown.index("</select>", shown.index('id="pg-compare"'))]
    assert f'<option value="{SMOLLM2}" selected>' in compare
    second_pane = shown[shown.index('id="pg-pane-compare"'):shown.index(">", shown.index('id="pg-pane-compare"'))]
    assert "hidden" not in second_pane
    assert 'id="pg-answer-compare"' in shown and 'id="pg-answer"' in shown


def test_without_compare_the_second_pane_stays_hidden(page):
    shown = page.get(f"/serving/playground/?deployment={GEMMA3}").content.decode()

    second_pane = shown[shown.index('id="pg-pane-compare"'):shown.index(">", shown.index('id="pg-pane-compare"'))]
    assert "hidden" in second_pane
