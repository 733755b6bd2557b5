import pytest
from django.test import Client

from cluster import inventory
from cluster.services import register_node
from serving.models import Deployment
from serving.presets import SMOLLM2, register_presets

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(make_workspace) -> Client:
    make_workspace("Acme", owner="ann")
    register_node(name="box", resources=inventory.probe())
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


@pytest.mark.parametrize("form, message", [
    ({"replicas": "2", "weights": "3"}, "Give one weight per replica: 2 replica(s), 1 weight(s)."),
    ({"replicas": "2", "weights": "3,x"}, "Weights must be numbers separated by commas"),
    ({"replicas": "many"}, "Model, replicas, threads and cooldown must be numbers."),
    ({"threads": "two"}, "Threads must be a whole number."),
    ({"replicas": "1", "weights": "-1"}, "Replica weights must be positive."),
])
def test_a_bad_deployment_form_is_explained_on_the_page(signed_in, form, message):
    model = register_presets(lambda line: None)[SMOLLM2]

    response = signed_in.post("/serving/deployments/new/", {"model": model.pk, "node": "box", **form}, follow=True)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Deployment.objects.exists()


def test_registering_a_missing_file_in_the_gui_says_so(signed_in):
    response = signed_in.post("/serving/", {"name": "ghost", "path": "/tmp/ghost.gguf"}, follow=True)
    assert "No file or directory at /tmp/ghost.gguf." in response.content.decode()


def test_an_unknown_deployment_page_is_404(signed_in):
    assert signed_in.get("/serving/deployments/nope/").status_code == 404
