import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.models import AuditEntry, Membership

pytestmark = pytest.mark.django_db


def test_login_with_a_wrong_password_is_401_and_the_right_one_opens_a_session(make_workspace):
    make_workspace("Acme", owner="ann")
    client = APIClient()

    wrong = client.post("/api/auth/login/", {"username": "ann", "password": "nope"}, format="json")
    assert wrong.status_code == 401
    assert wrong.json() == {"error": {"code": "unauthenticated", "message": "Wrong username or password."}}

    right = client.post("/api/auth/login/", {"username": "ann", "password": "correct-horse-battery"}, format="json")
    assert right.status_code == 200
    assert client.get("/api/auth/me/").json()["role"] == "owner"
    assert client.post("/api/auth/logout/").status_code == 204
    assert client.get("/api/auth/me/").status_code == 401


def test_creating_a_workspace_makes_you_its_owner(make_user):
    make_user("ann")
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")

    created = client.post("/api/workspaces/", {"name": "Research Lab"}, format="json")

    assert created.status_code == 201
    assert created.json()["slug"] == "research-lab"
    assert client.get("/api/auth/me/", HTTP_X_WORKSPACE="research-lab").json()["role"] == "owner"
    assert AuditEntry.objects.filter(action="workspace.create").count() == 1


def test_admins_manage_members_and_developers_cannot(make_workspace, make_user, key_client):
    workspace = make_workspace("Acme", owner="ann", dev="developer")
    make_user("carol")
    owner = key_client("ann", workspace, role="owner")
    developer = key_client("dev", workspace)

    assert developer.post("/api/members/", {"username": "carol"}, format="json").status_code == 403
    added = owner.post("/api/members/", {"username": "carol", "role": "viewer"}, format="json")
    assert added.status_code == 201
    assert owner.post("/api/members/", {"username": "carol"}, format="json").status_code == 409
    unknown = owner.post("/api/members/", {"username": "nobody"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["message"] == "No user is called 'nobody'."

    promoted = owner.patch(f"/api/members/{added.json()['id']}/", {"role": "admin"}, format="json")
    assert promoted.json()["role"] == "admin"
    assert [m["username"] for m in developer.get("/api/members/").json()["results"]] == ["ann", "carol", "dev"]


def test_the_last_owner_cannot_be_removed_or_demoted(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    owner = key_client("ann", workspace, role="owner")
    membership = Membership.objects.get(workspace=workspace, user__username="ann")

    assert owner.delete(f"/api/members/{membership.pk}/").status_code == 409
    demote = owner.patch(f"/api/members/{membership.pk}/", {"role": "viewer"}, format="json")
    assert demote.status_code == 409
    assert demote.json()["error"]["message"] == "A workspace must keep at least one owner."


def test_unknown_api_paths_answer_json_404():
    response = APIClient().get("/api/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_the_openapi_schema_and_docs_are_served(make_workspace):
    make_workspace("Acme", owner="ann")
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/keys/" in schema.json()["paths"]
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content and b"cdn" not in docs.content.lower()


def test_by_default_only_platform_administrators_create_workspaces(make_user, settings):
    settings.WORKSPACE_CREATION = "staff"
    make_user("ann")
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")

    refused = client.post("/api/workspaces/", {"name": "Research Lab"}, format="json")
    assert refused.status_code == 403 and "platform administrators" in refused.json()["error"]["message"]
    page = client.get("/keys/", follow=True).content.decode()
    assert "Ask a platform administrator" in page and 'action="/workspaces/new/"' not in page

    get_user_model().objects.filter(username="ann").update(is_staff=True)
    assert client.post("/api/workspaces/", {"name": "Research Lab"}, format="json").status_code == 201
