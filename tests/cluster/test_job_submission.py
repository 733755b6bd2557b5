"""Issue 13, hole 1: the generic jobs API runs only kinds that act on no other app's objects."""

import pytest

from accounts.services import SYSTEM
from cluster import inventory
from cluster.models import Job
from cluster.services import register_node
from serving import services as serving_services
from serving.models import Replica, ServingState
from serving.presets import SMOLLM2, register_presets

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared_replica():
    node = register_node(name="box", resources=inventory.probe())
    model = register_presets(lambda line: None)[SMOLLM2]
    deployment = serving_services.create_deployment(actor=SYSTEM, workspace=None, model=model, name=SMOLLM2,
                                                    replicas=[(node, 1.0)])
    replica = deployment.replicas.get()
    Replica.objects.filter(pk=replica.pk).update(state=ServingState.READY)
    return replica


def test_a_key_of_a_brand_new_workspace_cannot_stop_a_shared_replica_through_the_jobs_api(
        make_workspace, key_client, shared_replica):
    stranger = key_client("mallory", make_workspace("Brand new", owner="mallory"), role="owner")

    for kind in ("serving.stop_replica", "serving.start_replica"):
        response = stranger.post("/api/cluster/jobs/", {"kind": kind, "node": "box",
                                                        "payload": {"replica_id": shared_replica.pk}}, format="json")
        assert response.status_code == 400
        assert "not through the jobs API" in response.json()["error"]["message"]
    assert not Job.objects.exists()
    shared_replica.refresh_from_db()
    assert shared_replica.state == ServingState.READY


def test_the_node_inventory_job_can_still_be_submitted_by_a_developer_but_not_a_viewer(make_workspace, key_client):
    register_node(name="box", resources=inventory.probe())
    workspace = make_workspace("Acme", owner="ann")
    developer, viewer = key_client("ann", workspace), key_client("ann", workspace, role="viewer")

    assert viewer.post("/api/cluster/jobs/", {"kind": "node.inventory", "node": "box"},
                       format="json").status_code == 403
    response = developer.post("/api/cluster/jobs/", {"kind": "node.inventory", "node": "box"}, format="json")
    assert response.status_code == 201 and response.json()["kind"] == "node.inventory"
    unknown = developer.post("/api/cluster/jobs/", {"kind": "rm -rf", "node": "box"}, format="json")
    assert unknown.status_code == 400 and "node.inventory" in unknown.json()["error"]["message"]
