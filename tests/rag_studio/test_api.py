"""The RAG Studio REST API: workspace scoping, clear 4xx errors, uploads and hit testing."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from rag_studio.models import KnowledgeBase
from tests.rag_studio.conftest import SAMPLES

pytestmark = pytest.mark.usefixtures("shared_northwind")


def test_create_knowledge_base_and_validation_errors_name_the_field(acme, key_client):
    client = key_client("ann", acme)
    created = client.post("/api/rag/knowledge-bases/", {"name": "Docs", "chunking": {"mode": "heading"}},
                          format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["embedding_model"] == "all-minilm-l6-v2" and created.json()["embedding_dimensions"] == 384
    bad = client.post("/api/rag/knowledge-bases/", {"name": "Bad", "chunking": {"mode": "sentences"}},
                      format="json")
    assert bad.status_code == 400 and "chunking" in bad.json()["error"]["fields"]
    clash = client.post("/api/rag/knowledge-bases/", {"name": "Docs"}, format="json")
    assert clash.status_code == 409
    weights = client.post("/api/rag/knowledge-bases/", {"name": "W", "retrieval": {"dense_weight": 3}},
                          format="json")
    assert weights.status_code == 400 and "dense_weight" in weights.json()["error"]["message"]


def test_unknown_and_foreign_knowledge_bases_are_404(acme, make_workspace, key_client, indexed_kb):
    other = make_workspace("Globex", "gil")
    outsider = key_client("gil", other)
    assert outsider.get(f"/api/rag/knowledge-bases/{indexed_kb.pk}/").status_code == 404
    assert outsider.post(f"/api/rag/knowledge-bases/{indexed_kb.pk}/hit-test/", {"query": "leave"},
                         format="json").status_code == 404
    document = indexed_kb.documents.first()
    assert outsider.delete(f"/api/rag/documents/{document.pk}/").status_code == 404
    assert key_client("ann", acme).get("/api/rag/knowledge-bases/999999/").status_code == 404


def test_upload_through_the_api_reports_each_file(acme, key_client, presets):
    client = key_client("ann", acme)
    kb_id = client.post("/api/rag/knowledge-bases/", {"name": "Up"}, format="json").json()["id"]
    faq = (SAMPLES / "northwind-support-faq.md").read_bytes()
    response = client.post(f"/api/rag/knowledge-bases/{kb_id}/documents/", {"files": [
        SimpleUploadedFile("faq.md", faq), SimpleUploadedFile("faq-copy.md", faq),
        SimpleUploadedFile("virus.exe", b"MZ")]}, format="multipart")
    assert response.status_code == 201
    statuses = [(o["filename"], o["status"]) for o in response.json()]
    assert statuses == [("faq.md", "queued"), ("faq-copy.md", "duplicate"), ("virus.exe", "failed")]
    assert "not supported" in response.json()[2]["document"]["error"]
    listed = client.get(f"/api/rag/knowledge-bases/{kb_id}/documents/").json()
    assert {d["filename"] for d in listed} == {"faq.md", "virus.exe"}
    assert client.post(f"/api/rag/knowledge-bases/{kb_id}/documents/", {}, format="multipart").status_code == 400


def test_hit_test_returns_every_score_and_rejects_empty_queries(acme, key_client, indexed_kb):
    client = key_client("ann", acme)
    response = client.post(f"/api/rag/knowledge-bases/{indexed_kb.pk}/hit-test/",
                           {"query": "lidar obstruction", "retrieval": {"top_k": 3}}, format="json")
    assert response.status_code == 200
    hits = response.json()["hits"]
    assert len(hits) == 3 and hits[0]["filename"] == "northwind-product-guide.docx"
    assert {"dense", "keyword", "fused", "rerank", "dense_raw", "keyword_raw", "page"} <= set(hits[0])
    empty = client.post(f"/api/rag/knowledge-bases/{indexed_kb.pk}/hit-test/", {"query": "  "}, format="json")
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    bad = client.post(f"/api/rag/knowledge-bases/{indexed_kb.pk}/hit-test/",
                      {"query": "x", "retrieval": {"mode": "fuzzy"}}, format="json")
    assert bad.status_code == 400 and "mode" in bad.json()["error"]["message"]


def test_eval_set_upload_and_a_malformed_file_names_the_line(acme, key_client, indexed_kb):
    client = key_client("ann", acme)
    good = SimpleUploadedFile("set.csv", "question,expected_answer,expected_sources\n"
                                         "How many days of leave?,25 days,northwind-employee-handbook.pdf\n".encode())
    created = client.post("/api/rag/eval-sets/", {"knowledge_base": indexed_kb.pk, "file": good},
                          format="multipart")
    assert created.status_code == 201 and created.json()["item_count"] == 1
    broken = SimpleUploadedFile("set.jsonl", b'{"question": "ok?", "expected_answer": "yes"}\n{"question": \n')
    response = client.post("/api/rag/eval-sets/", {"knowledge_base": indexed_kb.pk, "file": broken},
                           format="multipart")
    assert response.status_code == 400 and "line 2" in response.json()["error"]["message"]


def test_a_viewer_key_reads_but_cannot_change(acme, key_client, indexed_kb):
    viewer = key_client("ann", acme, role="viewer")
    assert viewer.get("/api/rag/knowledge-bases/").status_code == 200
    assert viewer.post("/api/rag/knowledge-bases/", {"name": "Nope"}, format="json").status_code == 403
    assert KnowledgeBase.objects.filter(name="Nope").count() == 0


def test_hit_test_takes_the_fusion_settings_and_names_a_bad_one(acme, key_client, indexed_kb):
    client = key_client("ann", acme)
    url = f"/api/rag/knowledge-bases/{indexed_kb.pk}/hit-test/"
    response = client.post(url, {"query": "lidar obstruction", "retrieval": {
        "max_per_document": 1, "rrf_k": 10, "fusion": "rrf", "normalisation": "max"}}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["settings"]["max_per_document"], body["settings"]["rrf_k"]) == (1, 10)
    documents = [hit["document_id"] for hit in body["hits"]]
    assert len(documents) == len(set(documents))  # one hit per document at most
    for retrieval, field in (({"max_per_document": 51}, "max_per_document"), ({"rrf_k": 0}, "rrf_k"),
                             ({"rrf_k": 2.5}, "rrf_k"), ({"normalisation": "minmax"}, "normalisation")):
        bad = client.post(url, {"query": "x", "retrieval": retrieval}, format="json")
        assert bad.status_code == 400 and field in bad.json()["error"]["message"], (retrieval, bad.json())
    saved = client.patch(f"/api/rag/knowledge-bases/{indexed_kb.pk}/", {"retrieval": {"max_per_document": 2}},
                         format="json")
    assert saved.status_code == 200, saved.json()
    assert client.patch(f"/api/rag/knowledge-bases/{indexed_kb.pk}/", {"retrieval": {"rrf_k": 500}},
                        format="json").status_code == 400
