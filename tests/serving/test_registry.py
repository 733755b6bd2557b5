import pytest
from rest_framework.test import APIClient

from serving.presets import MINILM, SMOLLM2, _smollm2_path, register_presets

pytestmark = pytest.mark.django_db


@pytest.fixture
def developer(make_workspace, key_client) -> APIClient:
    workspace = make_workspace("Acme", owner="ann")
    return key_client("ann", workspace)


def test_the_presets_are_registered_from_their_packages():
    lines = []
    models = register_presets(lines.append)

    smollm = models[SMOLLM2]
    assert (smollm.family, smollm.quantization, smollm.context_length) == ("llama", "Q4_1", 8192)
    assert 130_000_000 < smollm.parameter_count < 140_000_000
    assert smollm.supports_chat
    gemma = models["gemma-3-270m"]
    assert gemma.family == "gemma3" and not gemma.supports_chat
    assert "completion only" in " ".join(lines)
    assert models[MINILM].is_embedding and models[MINILM].embedding_dimensions == 384
    assert register_presets(lines.append) == models


def test_registering_a_gguf_reads_its_header(developer):
    response = developer.post("/api/serving/models/", {"name": "My SmolLM", "path": str(_smollm2_path())},
                              format="json")
    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["kind"], body["quantization"], body["has_chat_template"]) == (
        "my-smollm", "gguf", "Q4_1", True)
    duplicate = developer.post("/api/serving/models/", {"name": "my-smollm", "path": str(_smollm2_path())},
                               format="json")
    assert duplicate.status_code == 409


@pytest.mark.parametrize("content, message", [
    (b"", "is not a GGUF file"),
    (b"PK\x03\x04 this is a zip", "is not a GGUF file"),
    (b"GGUF\x03\x00\x00\x00 truncated", "is not a readable GGUF file"),
])
def test_a_file_that_is_not_a_valid_gguf_is_refused_with_a_reason(developer, tmp_path, content, message):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    response = developer.post("/api/serving/models/", {"name": "bad", "path": str(bad)}, format="json")
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_missing_paths_directories_and_bad_urls_are_refused(developer, tmp_path):
    missing = developer.post("/api/serving/models/", {"name": "x", "path": "/nowhere/model.gguf"}, format="json")
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "No file or directory at /nowhere/model.gguf."
    empty_dir = developer.post("/api/serving/models/", {"name": "x", "path": str(tmp_path)}, format="json")
    assert "not a Hugging Face model" in empty_dir.json()["error"]["message"]
    url = developer.post("/api/serving/models/", {"name": "x", "url": "ftp://example"}, format="json")
    assert url.status_code == 400
    both = developer.post("/api/serving/models/", {"name": "x"}, format="json")
    assert both.json()["error"]["message"].startswith("Give either a path")


def test_an_external_endpoint_registers_by_url(developer):
    response = developer.post("/api/serving/models/", {"name": "big-remote", "url": "https://llm.internal/v1",
                                                       "api_key": "sk-x", "role_hint": "big"}, format="json")
    assert response.status_code == 201
    assert response.json()["supports_chat"] is True
    assert "api_key" not in response.json()
