"""User A can neither read nor change workspace B's objects through the API."""

import pytest
from rest_framework.test import APIClient

from accounts import services
from accounts.models import ApiKey, Membership
from accounts.services import Actor
from cluster import inventory
from cluster.services import dispatch_job, register_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_workspaces(make_workspace, key_client):
    acme = make_workspace("Acme", owner="ann")
    globex = make_workspace("Globex", owner="bob")
    bob_key = services.create_api_key(actor=Actor(user=globex.memberships.get().user), workspace=globex,
                                      name="bob-secret").api_key
    node = register_node(name="gpu-1", resources=inventory.probe())
    bob_job = dispatch_job(actor=Actor(user=bob_key.created_by), workspace=globex, kind="node.inventory", node=node)
    return {"ann": key_client("ann", acme, role="owner"), "bob_key": bob_key, "bob_job": bob_job, "globex": globex}


def test_another_workspaces_key_is_not_found(two_workspaces):
    ann, bob_key = two_workspaces["ann"], two_workspaces["bob_key"]
    assert ann.get(f"/api/keys/{bob_key.pk}/").status_code == 404
    assert ann.post(f"/api/keys/{bob_key.pk}/revoke/").status_code == 404
    assert ann.delete(f"/api/keys/{bob_key.pk}/").status_code == 404
    assert "bob-secret" not in [k["name"] for k in ann.get("/api/keys/").json()["results"]]
    assert ApiKey.objects.get(pk=bob_key.pk).revoked_at is None


def test_another_workspaces_job_is_not_found(two_workspaces):
    ann, job = two_workspaces["ann"], two_workspaces["bob_job"]
    response = ann.get(f"/api/cluster/jobs/{job.pk}/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert ann.post(f"/api/cluster/jobs/{job.pk}/cancel/").status_code == 404
    assert ann.get("/api/cluster/jobs/").json()["results"] == []


def test_another_workspaces_members_and_audit_are_invisible(two_workspaces):
    ann, globex = two_workspaces["ann"], two_workspaces["globex"]
    bob_membership = Membership.objects.get(workspace=globex)
    assert ann.get(f"/api/members/{bob_membership.pk}/").status_code == 404
    assert ann.delete(f"/api/members/{bob_membership.pk}/").status_code == 404
    audit = ann.get("/api/audit/").json()["results"]
    assert audit and all(entry["detail"].get("name") != "bob-secret" for entry in audit)
    assert "job.dispatch" not in [entry["action"] for entry in audit]


def test_a_session_user_cannot_select_a_workspace_they_are_not_in(two_workspaces):
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")
    response = client.get("/api/keys/", HTTP_X_WORKSPACE=two_workspaces["globex"].slug)
    assert response.status_code == 404
    assert [w["name"] for w in client.get("/api/workspaces/").json()["results"]] == ["Acme"]
    assert client.get(f"/api/workspaces/{two_workspaces['globex'].pk}/").status_code == 404
