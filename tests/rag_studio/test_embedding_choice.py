"""The embedding model is settled before the first embedding (issue 34): a knowledge base created without one gets
the model that reads its first documents' language, and says why; a model the user chose is kept, and a mismatch
is reported. Two documents of a new base ingested at once agree on one model."""

import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from rag_studio import services
from rag_studio.models import Document, DocumentStatus, KnowledgeBase, Stage
from rag_studio.pipeline import ingestion
from rag_studio.pipeline.ingestion import ingest
from rag_studio.search.retrieval import retrieve
from serving.preset_names import MINILM, MULTILINGUAL_E5
from tests.rag_studio.conftest import SAMPLES, sample

HANDOVER = "huadong-shift-handover.txt"
RULES = "huadong-maintenance-rules.docx"


def _upload_and_ingest(client, kb_id: int, names: list[str]) -> None:
    response = client.post(f"/api/rag/knowledge-bases/{kb_id}/documents/", {
        "files": [SimpleUploadedFile(name, (SAMPLES / name).read_bytes()) for name in names]}, format="multipart")
    assert response.status_code == 201, response.json()
    for outcome in response.json():
        document_id = outcome["document"]["id"]
        assert ingest(document_id, "pytest") == "indexed", Document.objects.get(pk=document_id).error


def test_a_chinese_knowledge_base_made_through_the_api_without_a_model_gets_the_multilingual_one(
        acme, key_client, presets):
    client = key_client("ann", acme)
    created = client.post("/api/rag/knowledge-bases/", {"name": "交接班"}, format="json").json()
    assert created["embedding_model_source"] == "pending"
    assert "picked from the language of the first documents" in created["embedding_model_reason"]

    _upload_and_ingest(client, created["id"], [HANDOVER])

    kb = client.get(f"/api/rag/knowledge-bases/{created['id']}/").json()
    assert (kb["embedding_model"], kb["embedding_model_source"], kb["language"]) == (MULTILINGUAL_E5, "detected", "zh")
    assert "the first documents are Chinese" in kb["embedding_model_reason"]
    assert f"{MINILM} reads English only" in kb["embedding_model_reason"]
    assert kb["embedding_model_mismatch"] is None and not kb["needs_reindex"]
    # Its vectors are the multilingual model's: dense search alone finds the Chinese passage by meaning.
    hits = retrieve(KnowledgeBase.objects.get(pk=kb["id"]), "接班的人要提前多久到？",
                    {"mode": "dense", "top_k": 3}).hits
    assert any("提前三十分钟到岗" in hit.text for hit in hits)


def test_an_english_knowledge_base_without_a_model_keeps_the_default_and_says_why(acme, key_client, presets):
    client = key_client("ann", acme)
    kb_id = client.post("/api/rag/knowledge-bases/", {"name": "FAQ"}, format="json").json()["id"]

    _upload_and_ingest(client, kb_id, ["northwind-employee-handbook.pdf"])

    kb = client.get(f"/api/rag/knowledge-bases/{kb_id}/").json()
    assert (kb["embedding_model"], kb["embedding_model_source"]) == (MINILM, "detected")
    assert "the first documents are English" in kb["embedding_model_reason"]
    assert kb["embedding_model_mismatch"] is None


def test_an_explicit_english_model_on_chinese_text_is_kept_and_the_mismatch_reported(acme, key_client, presets, ann):
    client = key_client("ann", acme)
    kb_id = client.post("/api/rag/knowledge-bases/", {"name": "巡检", "embedding_model": MINILM},
                        format="json").json()["id"]

    _upload_and_ingest(client, kb_id, [HANDOVER])

    kb = client.get(f"/api/rag/knowledge-bases/{kb_id}/").json()
    assert (kb["embedding_model"], kb["embedding_model_source"]) == (MINILM, "chosen")
    assert kb["embedding_model_reason"] == "Chosen by the user; never changed automatically."
    assert f"{MINILM} reads English only" in kb["embedding_model_mismatch"]
    assert f"Re-index with {MULTILINGUAL_E5}" in kb["embedding_model_mismatch"]
    # The page offers the switch, and says nothing of an automatic choice.
    page = Client(HTTP_ACCEPT_LANGUAGE="en")
    page.force_login(ann.user)
    html = page.get(f"/rag/kb/{kb_id}/").content.decode()
    assert 'id="multilingual-embedding"' in html and 'id="embedding-choice"' not in html


def test_naming_the_default_model_before_any_document_is_a_choice_the_documents_do_not_override(
        acme, key_client, presets):
    client = key_client("ann", acme)
    kb_id = client.post("/api/rag/knowledge-bases/", {"name": "Kept"}, format="json").json()["id"]
    patched = client.patch(f"/api/rag/knowledge-bases/{kb_id}/", {"embedding_model": MINILM}, format="json").json()
    assert patched["embedding_model_source"] == "chosen"

    _upload_and_ingest(client, kb_id, [HANDOVER])

    assert client.get(f"/api/rag/knowledge-bases/{kb_id}/").json()["embedding_model"] == MINILM


def test_the_page_says_which_model_was_picked_and_why(acme, ann, presets):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="二号装置")
    english, chinese = Client(HTTP_ACCEPT_LANGUAGE="en"), Client(HTTP_ACCEPT_LANGUAGE="zh-CN")
    for client in (english, chinese):
        client.force_login(ann.user)
    # The English form leaves the choice to the documents unless the user picks a model.
    assert '<option value="" selected>Automatic' in english.get("/rag/").content.decode()
    pending = english.get(f"/rag/kb/{kb.pk}/").content.decode()
    assert 'data-state="pending"' in pending and "picked from the language of the first documents" in pending
    # Saving other settings from the page leaves the choice to the documents.
    english.post(f"/rag/kb/{kb.pk}/settings/", {"name": kb.name, "chunk_mode": "recursive", "embedding_model": ""})
    assert KnowledgeBase.objects.get(pk=kb.pk).embedding_model_source == "pending"

    outcome, = services.upload_documents(actor=ann, kb=kb, uploads=[sample(HANDOVER)])
    assert ingest(outcome.document.pk, "pytest") == "indexed"

    page = english.get(f"/rag/kb/{kb.pk}/").content.decode()
    assert 'data-state="switched"' in page and f"The embedding model {MULTILINGUAL_E5} was picked automatically" in page
    assert 'id="multilingual-embedding"' not in page
    assert "自动选择" in chinese.get(f"/rag/kb/{kb.pk}/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_two_documents_of_a_new_base_ingested_at_once_agree_on_one_model(acme, ann, presets, monkeypatch):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="并发")
    first, second = services.upload_documents(actor=ann, kb=kb, uploads=[sample(HANDOVER), sample(RULES)])
    embed = ingestion.GROUP_STAGES[Stage.EMBED]
    both_ready = threading.Barrier(2, timeout=60)

    def embed_when_both_are_ready(documents, worker, **options):
        # Each worker loaded the knowledge base (still on the provisional default) before either embeds.
        assert documents[0].knowledge_base.embedding_model.name == MINILM
        both_ready.wait()
        embed(documents, worker, **options)

    monkeypatch.setitem(ingestion.GROUP_STAGES, Stage.EMBED, embed_when_both_are_ready)
    outcomes = {}
    workers = [threading.Thread(target=lambda d=d, w=w: outcomes.__setitem__(w, ingest(d.document.pk, w, group=1)))
               for d, w in ((first, "worker-a"), (second, "worker-b"))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)

    assert outcomes == {"worker-a": DocumentStatus.INDEXED, "worker-b": DocumentStatus.INDEXED}
    kb.refresh_from_db()
    assert kb.embedding_model.name == MULTILINGUAL_E5
    # Both documents' vectors are the multilingual model's: each is found by meaning with dense search alone.
    assert any("提前三十分钟到岗" in hit.text
               for hit in retrieve(kb, "接班的人要提前多久到？", {"mode": "dense", "top_k": 3}).hits)
    assert any(hit.filename == RULES
               for hit in retrieve(kb, "离心泵的轴承最高允许多少度？", {"mode": "dense", "top_k": 3}).hits)
