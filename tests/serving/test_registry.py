from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.models import KeyScope, Role
from accounts.services import SYSTEM
from cluster.models import Node
from serving import services
from serving.gguf_info import read_gguf
from serving.models import Deployment, Model
from serving.presets import GEMMA3, GEMMA3_CHAT_TEMPLATE, MINILM, SMOLLM2, _smollm2_path, register_presets

pytestmark = pytest.mark.django_db


@pytest.fixture
def developer(make_workspace, key_client, settings, tmp_path) -> APIClient:
    """A platform administrator (registering model files is theirs), with the presets' and the test's own
    directories as model directories."""
    settings.MODEL_DIRS = [_smollm2_path().parent, tmp_path]
    workspace = make_workspace("Acme", owner="ann")
    get_user_model().objects.filter(username="ann").update(is_staff=True)
    return key_client("ann", workspace, role=Role.ADMIN, scope=KeyScope.PLATFORM)


def test_the_presets_are_registered_from_their_packages():
    lines = []
    models = register_presets(lines.append)

    smollm = models[SMOLLM2]
    assert (smollm.family, smollm.quantization, smollm.context_length) == ("llama", "Q4_1", 8192)
    assert 130_000_000 < smollm.parameter_count < 140_000_000
    assert smollm.supports_chat
    gemma = models["gemma-3-270m"]
    # A base model whose file has no chat template: the registry gives it Gemma 3's, so it serves chat.
    assert gemma.family == "gemma3" and gemma.supports_chat and "<start_of_turn>" in gemma.chat_template
    assert read_gguf(Path(gemma.path)).chat_template == ""
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
    missing = developer.post("/api/serving/models/", {"name": "x", "path": str(tmp_path / "model.gguf")},
                             format="json")
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == f"No file or directory at {tmp_path / 'model.gguf'}."
    empty_dir = developer.post("/api/serving/models/", {"name": "x", "path": str(tmp_path)}, format="json")
    assert "not a Hugging Face model" in empty_dir.json()["error"]["message"]
    url = developer.post("/api/serving/models/", {"name": "x", "url": "ftp://example"}, format="json")
    assert url.status_code == 400
    both = developer.post("/api/serving/models/", {"name": "x"}, format="json")
    assert both.json()["error"]["message"].startswith("Give either a path")


def test_an_external_endpoint_registers_by_url(developer, settings):
    # Public DNS cannot be reached here: the platform-wide allowlist opens the test's loopback name instead.
    settings.EGRESS_ALLOW = ["localhost"]
    response = developer.post("/api/serving/models/", {"name": "big-remote", "url": "http://localhost:9/v1",
                                                       "api_key": "sk-x", "role_hint": "big"}, format="json")
    assert response.status_code == 201
    assert response.json()["supports_chat"] is True
    assert "api_key" not in response.json()


def test_a_preset_registered_before_it_had_a_template_gets_one_at_the_next_setup():
    register_presets(lambda line: None)
    Model.objects.filter(name=GEMMA3).update(chat_template="")
    lines = []

    gemma = register_presets(lines.append)[GEMMA3]

    assert gemma.chat_template == GEMMA3_CHAT_TEMPLATE and gemma.supports_chat
    assert lines == [f"Set the chat template of preset model {GEMMA3}"]


def test_a_chat_template_turns_a_base_model_into_a_chat_model_and_blank_restores_the_files(developer):
    registered = developer.post("/api/serving/models/", {"name": "base", "path": str(_smollm2_path()),
                                                         "chat_template": ""}, format="json").json()
    assert registered["supports_chat"] is False

    url = f"/api/serving/models/{registered['id']}/chat-template/"
    set_one = developer.post(url, {"chat_template": GEMMA3_CHAT_TEMPLATE}, format="json")
    assert set_one.status_code == 200 and set_one.json()["supports_chat"] is True
    broken = developer.post(url, {"chat_template": "{% for m in messages %}{{ m.content }}"}, format="json")
    assert broken.status_code == 400 and "not valid Jinja (line 1" in broken.json()["error"]["message"]
    restored = developer.post(url, {"chat_template": ""}, format="json")
    assert restored.json()["supports_chat"] is True
    assert Model.objects.get(pk=registered["id"]).chat_template == read_gguf(_smollm2_path()).chat_template


def test_only_platform_administrators_change_a_shared_models_template(make_workspace, key_client):
    gemma = register_presets(lambda line: None)[GEMMA3]
    workspace = make_workspace("Acme", owner="ann", dev="developer")
    url = f"/api/serving/models/{gemma.pk}/chat-template/"

    for username, role in (("dev", Role.DEVELOPER), ("ann", Role.OWNER)):
        refused = key_client(username, workspace, role=role).post(url, {"chat_template": "{{ x }}"}, format="json")
        assert refused.status_code == 403
    assert Model.objects.get(pk=gemma.pk).chat_template == GEMMA3_CHAT_TEMPLATE
    get_user_model().objects.filter(username="ann").update(is_staff=True)
    staff_workspace_key = key_client("ann", workspace, role=Role.ADMIN)
    assert staff_workspace_key.post(url, {"chat_template": "{{ x }}"}, format="json").status_code == 403
    allowed = key_client("ann", workspace, role=Role.ADMIN, scope=KeyScope.PLATFORM).post(
        url, {"chat_template": "{{ x }}"}, format="json")
    assert allowed.status_code == 200


def test_another_workspaces_model_and_deployment_are_404_to_the_new_endpoints(developer, make_workspace, key_client):
    registered = developer.post("/api/serving/models/", {"name": "own", "path": str(_smollm2_path())},
                                format="json").json()
    model = Model.objects.get(pk=registered["id"])
    node = Node.objects.create(name="box", memory_bytes=16 * 2**30)
    deployment = services.create_deployment(actor=SYSTEM, workspace=model.workspace, model=model, name="own",
                                            replicas=[(node, 1.0)])
    stranger = key_client("zed", make_workspace("Other", owner="zed"))

    template = stranger.post(f"/api/serving/models/{model.pk}/chat-template/", {"chat_template": "{{ x }}"},
                             format="json")
    engine = stranger.get(f"/api/serving/deployments/{deployment.name}/engine/")

    assert (template.status_code, engine.status_code) == (404, 404)
    assert Model.objects.get(pk=model.pk).chat_template == read_gguf(_smollm2_path()).chat_template
    assert Deployment.objects.filter(name="own").exists()


@pytest.mark.parametrize("engine_settings, message", [
    ({"context_length": 100_000}, "beyond what 'smollm2-135m-instruct' was trained for (8192)"),
    ({"parallel": 0}, "'parallel' must be a whole number from 1 to 64; got 0."),
    ({"threads": "two"}, "'threads' must be a whole number from 1 to 512; got 'two'."),
    ({"prompt_cache_mib": -1}, "'prompt_cache_mib' must be a whole number from 0 to 1048576; got -1."),
    ({"parallel": 64, "context_length": 8192},
     "64 slots of 8192 tokens need a 11.2 GiB KV cache, more than node 'small-box' can hold"),
])
def test_engine_settings_that_cannot_work_are_refused_before_anything_starts(developer, engine_settings, message):
    Node.objects.create(name="small-box", memory_bytes=2 * 2**30)
    register_presets(lambda line: None)

    response = developer.post("/api/serving/deployments/", {
        "model": SMOLLM2, "engine": "llamacpp", "settings": engine_settings, "start": False,
        "replicas": [{"node": "small-box"}]}, format="json")

    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_the_engines_prompt_cache_in_memory_is_bounded_unless_the_deployment_says_otherwise(tmp_path):
    from serving.engines.base import Listen
    from serving.engines.llamacpp import DEFAULT_PROMPT_CACHE_MIB, LlamaCppEngine

    model = register_presets(lambda line: None)[SMOLLM2]
    listen = Listen(host="127.0.0.1", port=1, key_file=tmp_path / "key")

    def cache_ram(settings: dict) -> str:
        argv = LlamaCppEngine().launch_spec(model=model, settings=settings, served_name=SMOLLM2, listen=listen).argv
        return argv[argv.index("--cache-ram") + 1]

    # llama-server's own default lets a replica grow by up to 8 GiB of cached prompts.
    assert cache_ram({}) == str(DEFAULT_PROMPT_CACHE_MIB) == "256"
    assert cache_ram({"prompt_cache_mib": 0}) == "0" and cache_ram({"prompt_cache_mib": 1024}) == "1024"
