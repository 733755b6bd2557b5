import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from cluster import inventory
from cluster.services import register_node
from serving.models import Deployment, Model
from serving.presets import SMOLLM2, _gemma3_path, register_presets

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(make_workspace, settings) -> Client:
    """A platform administrator, who may register model files from the model directories."""
    settings.MODEL_DIRS = [_gemma3_path().parent, "/tmp"]
    make_workspace("Acme", owner="ann")
    get_user_model().objects.filter(username="ann").update(is_staff=True)
    register_node(name="box", resources=inventory.probe())
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


@pytest.mark.parametrize("form, message", [
    ({"replicas": "2", "weights": "3"}, "Give one weight per replica: 2 replica(s), 1 weight(s)."),
    ({"replicas": "2", "weights": "3,x"}, "Weights must be numbers separated by commas"),
    ({"replicas": "many"}, "Model, replicas, threads and cooldown must be numbers."),
    ({"threads": "two"}, "Threads must be a whole number (got &#x27;two&#x27;)."),
    ({"parallel": "0"}, "&#x27;parallel&#x27; must be a whole number from 1 to 64; got 0."),
    ({"context_length": "999999999"}, "beyond what &#x27;smollm2-135m-instruct&#x27; was trained for"),
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


def test_a_workspace_model_gets_a_chat_template_from_its_row_on_the_models_page(signed_in):
    signed_in.post("/serving/", {"name": "my-gemma", "path": str(_gemma3_path())}, follow=True)
    model = Model.objects.get(name="my-gemma")
    assert not model.supports_chat
    url = f"/serving/models/{model.pk}/chat-template/"

    broken = signed_in.post(url, {"chat_template": "{% for m in messages %}"}, follow=True).content.decode()
    saved = signed_in.post(url, {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
                           follow=True).content.decode()

    assert "line 1" in broken
    assert "Saved the chat template of my-gemma: it now serves chat." in saved
    model.refresh_from_db()
    assert model.supports_chat
