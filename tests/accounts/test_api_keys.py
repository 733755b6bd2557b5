from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiKey, AuditEntry

pytestmark = pytest.mark.django_db


def test_a_new_key_is_shown_once_and_stored_only_as_a_hash(make_workspace):
    make_workspace("Acme", owner="ann")
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")

    created = client.post("/api/keys/", {"name": "intranet-bot"}, format="json")

    assert created.status_code == 201
    secret = created.json()["key"]
    assert secret.startswith("afk_")
    stored = ApiKey.objects.get(pk=created.json()["id"])
    assert secret not in (stored.key_hash, stored.prefix)
    listed = client.get("/api/keys/").json()["results"]
    assert [k["name"] for k in listed] == ["intranet-bot"]
    assert "key" not in listed[0]
    assert "key" not in client.get(f"/api/keys/{stored.pk}/").json()


def test_a_key_authenticates_as_bearer_and_records_last_use(make_workspace):
    workspace = make_workspace("Acme", owner="ann")
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")
    secret = client.post("/api/keys/", {"name": "ci"}, format="json").json()["key"]

    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    me = bearer.get("/api/auth/me/")

    assert me.status_code == 200
    assert me.json()["workspace"]["slug"] == workspace.slug
    assert me.json()["role"] == "developer"
    assert ApiKey.objects.get(name="ci").last_used_at is not None


def test_a_revoked_key_is_refused_with_401(make_workspace):
    make_workspace("Acme", owner="ann")
    client = APIClient()
    client.login(username="ann", password="correct-horse-battery")
    created = client.post("/api/keys/", {"name": "old"}, format="json").json()
    assert client.post(f"/api/keys/{created['id']}/revoke/").json()["revoked"] is True

    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {created['key']}")
    response = bearer.get("/api/auth/me/")

    assert response.status_code == 401
    assert response.json()["error"]["message"] == "This API key has been revoked."


def test_an_expired_or_made_up_key_is_refused_with_401(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    client = key_client("ann", workspace)
    ApiKey.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    assert client.get("/api/auth/me/").json()["error"]["message"] == "This API key has expired."

    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION="Bearer afk_000000000000.not-a-real-secret")
    response = forged.get("/api/auth/me/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_no_credentials_get_401_with_a_json_body():
    response = APIClient().get("/api/keys/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_viewer_cannot_create_keys_and_a_key_cannot_outrank_its_maker(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann", vic="viewer", dev="developer")
    viewer = APIClient()
    viewer.login(username="vic", password="correct-horse-battery")
    refused = viewer.post("/api/keys/", {"name": "x"}, format="json")
    assert refused.status_code == 403
    assert "developer role" in refused.json()["error"]["message"]

    developer = key_client("dev", workspace)
    too_strong = developer.post("/api/keys/", {"name": "admin-key", "role": "admin"}, format="json")
    assert too_strong.status_code == 403


def test_a_bad_key_request_names_the_field(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    response = key_client("ann", workspace).post("/api/keys/", {"role": "emperor"}, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"name", "role"}


def test_key_creation_and_revocation_are_audited(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    client = key_client("ann", workspace, role="owner")
    created = client.post("/api/keys/", {"name": "second"}, format="json").json()
    client.delete(f"/api/keys/{created['id']}/")

    actions = list(AuditEntry.objects.filter(workspace=workspace).values_list("action", flat=True))
    assert actions[:3] == ["api_key.revoke", "api_key.create", "api_key.create"]
    audit = client.get("/api/audit/?action=api_key.revoke").json()["results"]
    assert audit[0]["target_id"] == str(created["id"])
    assert audit[0]["actor"] == "ann"


def test_only_a_platform_administrator_signed_in_makes_a_platform_key_and_the_list_says_so(make_workspace,
                                                                                       key_client):
    workspace = make_workspace("Acme", owner="ann")
    session = APIClient()
    session.login(username="ann", password="correct-horse-battery")
    platform = {"name": "ops", "role": "owner", "scope": "platform"}

    refused = session.post("/api/keys/", platform, format="json")
    assert refused.status_code == 403 and "platform administrator" in refused.json()["error"]["message"]
    get_user_model().objects.filter(username="ann").update(is_staff=True)
    # Not through a key: a key may sit in any script, and would mint platform keys for it.
    through_key = key_client("ann", workspace, role="owner").post("/api/keys/", platform, format="json")
    assert through_key.status_code == 403
    made = session.post("/api/keys/", platform, format="json")
    assert made.status_code == 201 and made.json()["scope"] == "platform"
    assert {k["name"]: k["scope"] for k in session.get("/api/keys/").json()["results"]}["ops"] == "platform"
    assert session.post("/api/keys/", {"name": "x", "scope": "galaxy"}, format="json").status_code == 400
    page = Client()
    page.login(username="ann", password="correct-horse-battery")
    assert 'name="scope"' in page.get("/keys/").content.decode()


def test_a_key_made_in_the_gui_is_shown_once_with_a_copy_button_that_needs_no_network(make_workspace):
    make_workspace("Acme", owner="ann")
    page = Client()
    page.login(username="ann", password="correct-horse-battery")

    shown = page.post("/keys/", {"name": "intranet-bot", "role": "developer"}, follow=True).content.decode()

    stored = ApiKey.objects.get(name="intranet-bot")
    assert f'id="new-key" class="secret" readonly value="afk_{stored.prefix}' in shown
    assert 'data-copy="new-key"' in shown and "js/copy.js" in shown
    assert 'id="new-key"' not in page.get("/keys/").content.decode()
    # The Clipboard API exists only on HTTPS or localhost: over plain HTTP the field is selected and copied.
    script = (settings.BASE_DIR / "static" / "js" / "copy.js").read_text()
    assert "navigator.clipboard.writeText" in script and 'document.execCommand("copy")' in script
