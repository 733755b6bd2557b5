"""An app exported as a signed bundle and imported into another workspace: published there with its settings
and searchable knowledge base; a tampered app bundle leaves nothing behind."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from assets.models import Asset, AssetKind
from rag_studio.models import KnowledgeBase, RagConfig
from rag_studio.search.retrieval import retrieve
from runtime import services
from runtime.models import App
from tests.assets.tampering import manifest_of, members, pack
from tests.runtime.conftest import save_config

pytestmark = pytest.mark.django_db


@pytest.fixture
def globex(make_workspace):
    return make_workspace("Globex", "gil")


def _export(client, slug: str) -> bytes:
    response = client.get(f"/api/runtime/apps/{slug}/export/", {"include_indexes": 1})
    assert response.status_code == 200, response.content[:300]
    return b"".join(response.streaming_content)


def _import(client, data: bytes):
    return client.post("/api/assets/import/", {"bundle": SimpleUploadedFile("app.zip", data)}, format="multipart")


def test_an_exported_app_is_published_again_in_another_workspace(ann, acme, globex, indexed_kb, smollm2,
                                                                  key_client):
    app = services.publish_app(actor=ann, config=save_config(ann, indexed_kb), slug="handbook")
    services.update_app(actor=ann, app=app, allowed_origins=["https://intranet.example"], rate_limit=7,
                        opener="Hello.", suggested_questions=["Who approves leave?"])
    save_config(ann, indexed_kb, config=app.rag_config, generation={"max_tokens": 99})  # v2, not served
    assert Asset.objects.get(workspace=acme, kind=AssetKind.APP).latest_version >= 1

    data = _export(key_client("ann", acme), "handbook")
    manifest = manifest_of(data)
    assert manifest["kind"] == "app" and manifest["app"]["slug"] == "handbook"
    assert [e["version"] for e in manifest["entries"] if e["kind"] == "rag_config"] == [1]

    response = _import(key_client("gil", globex), data)
    assert response.status_code == 201, response.json()
    assert {a["kind"] for a in response.json()["assets"]} == {"knowledge_base", "rag_config", "app"}
    imported = App.objects.get(workspace=globex)
    assert imported.slug == "handbook-2"  # the slug is global, and taken by the original
    assert (imported.default_rate_limit, imported.allowed_origins) == (7, ["https://intranet.example"])
    assert (imported.opener, imported.suggested_questions) == ("Hello.", ["Who approves leave?"])
    assert imported.current_release.config_version.settings["generation"]["max_tokens"] == 32
    assert imported.widget_token != app.widget_token and not imported.keys.exists()
    kb = KnowledgeBase.objects.get(workspace=globex)
    assert retrieve(kb, "How many days of annual leave?").hits[0].filename == "northwind-employee-handbook.pdf"


def test_a_tampered_app_bundle_imports_nothing(ann, acme, globex, kb, config, key_client):
    services.publish_app(actor=ann, config=config, slug="handbook")
    data = _export(key_client("ann", acme), "handbook")
    contents = members(data)
    contents["manifest.json"] = contents["manifest.json"].replace(b'"handbook"', b'"stolen"')
    before = [model.objects.count() for model in (App, KnowledgeBase, RagConfig, Asset)]
    response = _import(key_client("gil", globex), pack(contents))
    assert response.status_code == 400 and "signature" in response.json()["error"]["message"]
    assert [model.objects.count() for model in (App, KnowledgeBase, RagConfig, Asset)] == before
