"""The asset registry: versions only for new content, listed per workspace by the API and the Assets page."""

from django.contrib.auth import get_user_model

from accounts.services import Actor
from assets.models import AssetKind
from assets.services import forget_asset, payload_checksum, register_asset


def test_registering_the_same_content_again_writes_no_new_version(make_workspace):
    workspace = make_workspace("Acme", "ann")
    ann = Actor(user=get_user_model().objects.get(username="ann"))
    first = register_asset(workspace=workspace, kind=AssetKind.TOOL, ref_id=7, name="Weather",
                           payload={"url": "https://example.com", "method": "GET"}, actor=ann)
    again = register_asset(workspace=workspace, kind=AssetKind.TOOL, ref_id=7, name="Weather v2",
                           payload={"method": "GET", "url": "https://example.com"})
    assert again.pk == first.pk and first.number == 1 and first.created_by.username == "ann"
    assert again.asset.name == "Weather v2"  # renamed, same content: the name follows, the version does not
    changed = register_asset(workspace=workspace, kind=AssetKind.TOOL, ref_id=7, name="Weather v2",
                             payload={"url": "https://example.com", "method": "POST"})
    assert changed.number == 2 and changed.asset.latest_version == 2
    assert changed.checksum == payload_checksum({"method": "POST", "url": "https://example.com"}) != first.checksum
    forget_asset(workspace=workspace, kind=AssetKind.TOOL, ref_id=7)
    assert not workspace.assets.exists()


def test_the_api_lists_a_workspaces_assets_with_versions_and_filters_by_kind(make_workspace, key_client):
    acme = make_workspace("Acme", "ann")
    globex = make_workspace("Globex", "gil")
    register_asset(workspace=acme, kind=AssetKind.TOOL, ref_id=1, name="Search", payload={"v": 1})
    register_asset(workspace=acme, kind=AssetKind.TOOL, ref_id=1, name="Search", payload={"v": 2})
    register_asset(workspace=acme, kind=AssetKind.AGENT, ref_id=1, name="Helper", payload={})
    register_asset(workspace=globex, kind=AssetKind.TOOL, ref_id=1, name="Secret tool", payload={})

    viewer = key_client("ann", acme, role="viewer")
    listed = viewer.get("/api/assets/").json()["results"]
    assert {a["name"] for a in listed} == {"Search", "Helper"}
    tools = viewer.get("/api/assets/", {"kind": "tool"}).json()["results"]
    assert [(a["name"], [v["number"] for v in a["versions"]]) for a in tools] == [("Search", [2, 1])]
    key = viewer.get("/api/assets/instance-key/").json()
    assert len(key["public_key"]) == 44 and key["fingerprint"].count(":") == 3
    refused = viewer.post("/api/assets/import/", {}, format="multipart")
    assert refused.status_code == 403


def test_the_assets_page_shows_versions_the_public_key_and_the_import_form_to_developers(make_workspace, client):
    acme = make_workspace("Acme", "ann", vic="viewer")
    version = register_asset(workspace=acme, kind=AssetKind.TOOL, ref_id=3, name="Lookup", payload={"a": 1})
    client.login(username="ann", password="correct-horse-battery")
    page = client.get("/assets/").content.decode()
    assert 'data-asset="Lookup"' in page and version.checksum[:12] in page
    assert 'aria-current="page">Assets<' in page and 'name="bundle"' in page
    from assets.signing import instance_public_key

    assert instance_public_key() in page
    client.login(username="vic", password="correct-horse-battery")
    assert 'name="bundle"' not in client.get("/assets/").content.decode()
