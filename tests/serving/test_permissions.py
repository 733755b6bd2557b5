"""Issue 13, holes 2 and 4: serving's rules live in its services, so the GUI and the API enforce the same roles;
shared deployments are changed only by platform administrators; models are registered from files only by them, and
only from the model directories, with one answer for whatever lies outside."""

import shutil

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.models import AuditEntry, KeyScope, Workspace
from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from serving import services
from serving.models import Deployment, Model, Replica, ServingState
from serving.presets import SMOLLM2, _smollm2_path, register_presets

pytestmark = pytest.mark.django_db


@pytest.fixture
def presets(settings):
    register_node(name=settings.NODE_NAME, resources=inventory.probe())
    return register_presets(lambda line: None)


@pytest.fixture
def shared(presets):
    deployment = services.create_deployment(actor=SYSTEM, workspace=None, model=presets[SMOLLM2], name=SMOLLM2)
    Replica.objects.filter(deployment=deployment).update(state=ServingState.READY)
    return deployment


def _signed_in(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password="correct-horse-battery")
    return client


def _replica_states(deployment) -> set[str]:
    return set(deployment.replicas.values_list("state", flat=True))


def test_a_viewer_cannot_change_anything_on_the_serving_pages(make_workspace, presets):
    workspace = make_workspace("Acme", owner="ann", vic="viewer")
    own = services.create_deployment(actor=SYSTEM, workspace=workspace, model=presets[SMOLLM2], name="acme-chat")
    viewer = _signed_in("vic")

    for action in ("start", "stop"):
        page = viewer.post("/serving/deployments/acme-chat/", {"action": action}, follow=True)
        assert "This needs the developer role" in page.content.decode()
    viewer.post("/serving/deployments/acme-chat/", {"action": "routing", "cooldown_s": "1"}, follow=True)
    viewer.post(f"/serving/models/{presets[SMOLLM2].pk}/deploy/", follow=True)
    viewer.post("/serving/deployments/new/", {"model": presets[SMOLLM2].pk, "name": "mine"},
                follow=True)
    viewer.post("/serving/", {"name": "ext", "url": "https://api.example.com/v1"}, follow=True)

    own.refresh_from_db()
    assert own.cooldown_s == 30.0 and _replica_states(own) == {ServingState.PENDING}
    assert list(Deployment.objects.values_list("name", flat=True)) == ["acme-chat"]
    assert not Model.objects.filter(workspace=workspace).exists()


def test_only_a_platform_administrator_changes_a_shared_deployment(make_workspace, key_client, shared):
    # Anyone can make a workspace they own: owning one is no right over what every workspace shares.
    owner_api = key_client("ann", make_workspace("Acme", owner="ann"), role="owner")
    owner_gui = _signed_in("ann")

    for action in ("stop", "start"):
        response = owner_api.post(f"/api/serving/deployments/{SMOLLM2}/{action}/")
        assert response.status_code == 403 and "platform administrator" in response.json()["error"]["message"]
    assert owner_api.patch(f"/api/serving/deployments/{SMOLLM2}/routing/", {"cooldown_s": 1},
                           format="json").status_code == 403
    page = owner_gui.post(f"/serving/deployments/{SMOLLM2}/", {"action": "stop"}, follow=True)
    assert "platform administrator" in page.content.decode()
    assert _replica_states(shared) == {ServingState.READY}

    # A staff user's ordinary workspace key is a workspace key: it stops nothing that every tenant shares.
    get_user_model().objects.filter(username="ann").update(is_staff=True)
    staff_workspace_key = key_client("ann", Workspace.objects.get(name="Acme"), role="owner")
    response = staff_workspace_key.post(f"/api/serving/deployments/{SMOLLM2}/stop/")
    assert response.status_code == 403 and "platform administrator" in response.json()["error"]["message"]
    assert _replica_states(shared) == {ServingState.READY}

    platform_key = key_client("ann", Workspace.objects.get(name="Acme"), role="owner", scope=KeyScope.PLATFORM)
    response = platform_key.patch(f"/api/serving/deployments/{SMOLLM2}/routing/", {"cooldown_s": 5}, format="json")
    assert response.status_code == 200 and response.json()["cooldown_s"] == 5
    assert platform_key.post(f"/api/serving/deployments/{SMOLLM2}/stop/").status_code == 200
    used = AuditEntry.objects.filter(action="platform_key.use").values_list("detail__action", flat=True)
    assert len(used) == 2 and all(SMOLLM2 in action for action in used)
    assert AuditEntry.objects.filter(action="deployment.stop", api_key__scope=KeyScope.PLATFORM).exists()


@pytest.fixture
def model_dir(tmp_path, settings):
    settings.MODEL_DIRS = [tmp_path / "models"]
    (tmp_path / "models").mkdir()
    return tmp_path / "models"


def test_registering_a_model_by_path_is_for_platform_administrators_only(make_workspace, key_client, model_dir):
    (model_dir / "smol.gguf").symlink_to(_smollm2_path())
    developer = key_client("ann", make_workspace("Acme", owner="ann"), role="owner")

    response = developer.post("/api/serving/models/", {"name": "smol", "path": str(model_dir / "smol.gguf")},
                              format="json")
    assert response.status_code == 403 and "platform administrator" in response.json()["error"]["message"]
    assert not Model.objects.exists()


def test_outside_the_model_directories_every_path_gets_the_same_answer(make_workspace, key_client, model_dir,
                                                                       tmp_path):
    workspace = make_workspace("Ops", owner="ops")
    get_user_model().objects.filter(username="ops").update(is_staff=True)
    admin = key_client("ops", workspace, role="owner", scope=KeyScope.PLATFORM)
    not_gguf = tmp_path / "notes.txt"
    not_gguf.write_text("hello")
    answers = set()
    for path in ("/etc/passwd", "/nonexistent/model.gguf", str(tmp_path), str(not_gguf), "relative.gguf",
                 str(model_dir / ".." / "notes.txt"), str(_smollm2_path())):
        response = admin.post("/api/serving/models/", {"name": "probe", "path": path}, format="json")
        assert response.status_code == 400, path
        answers.add(response.json()["error"]["message"])
    assert len(answers) == 1 and "FACTORY_MODEL_DIRS" in answers.pop()

    (model_dir / "smol.gguf").symlink_to(_smollm2_path())
    inside = admin.post("/api/serving/models/", {"name": "smol", "path": str(model_dir / "smol.gguf")},
                        format="json")
    assert inside.status_code == 400  # the link leads outside the model directories
    shutil.copyfile(_smollm2_path(), model_dir / "real.gguf")
    registered = admin.post("/api/serving/models/", {"name": "smol", "path": str(model_dir / "real.gguf")},
                            format="json")
    assert registered.status_code == 201 and registered.json()["quantization"] == "Q4_1"
