"""Datasets through the API: uploads checked line by line, stored as versions, and previewed exactly as the model
will be trained on them."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from assets.models import Asset
from enhancement.files import SAMPLE_DATASET

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(make_workspace, key_client):
    workspace = make_workspace("Tuning", owner="tuner")
    api = key_client("tuner", workspace)
    api.workspace = workspace
    return api


def upload(client, name: str, lines: list, filename: str = "data.jsonl", **fields):
    content = "\n".join(line if isinstance(line, str) else json.dumps(line, ensure_ascii=False) for line in lines)
    return client.post("/api/enhancement/datasets/", {"name": name, "file": SimpleUploadedFile(
        filename, content.encode()), **fields}, format="multipart")


def test_alpaca_sharegpt_and_messages_uploads_become_the_same_conversations(client):
    alpaca = upload(client, "alpaca", [{"instruction": f"Say {i}", "input": "", "output": f"{i}"} for i in range(10)])
    sharegpt = upload(client, "sharegpt", [{"conversations": [{"from": "human", "value": "Hi"},
                                                              {"from": "gpt", "value": "Hello!"}]}] * 4)
    messages = upload(client, "messages", [{"messages": [{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": "你好"},
                                                         {"role": "assistant", "content": "你好！"}]}] * 3)
    assert alpaca.status_code == sharegpt.status_code == messages.status_code == 201, alpaca.json()
    assert alpaca.json()["source_format"] == "alpaca" and alpaca.json()["sample_count"] == 10
    assert alpaca.json()["validation_count"] == 1 and alpaca.json()["train_count"] == 9
    assert sharegpt.json()["source_format"] == "sharegpt" and messages.json()["source_format"] == "messages"


def test_broken_lines_are_refused_with_their_line_numbers(client):
    answer = upload(client, "broken", [
        {"instruction": "Fine", "output": "ok"},
        "{not json",
        {"instruction": "No answer", "output": "  "},
    ])
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "line 2: not valid JSON" in message
    assert "line 3: message 2 (assistant) is empty" in message
    assert client.get("/api/enhancement/datasets/").json()["count"] == 0


def test_wrong_roles_and_conversations_without_an_answer_are_named(client):
    answer = upload(client, "roles", [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Hello"}]},
        {"messages": [{"role": "user", "content": "Hi"}]},
    ])
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "line 1: message 2 has role 'bot'" in message
    assert "line 2: the conversation does not end with an assistant answer" in message


def test_over_long_samples_are_refused(client):
    answer = upload(client, "long", [{"instruction": "Repeat", "output": "x" * 40_000}])
    assert answer.status_code == 400
    assert "line 1: the sample is 40006 characters long" in answer.json()["error"]["message"]


def test_csv_with_a_column_mapping(client):
    content = "question,answer\nWhat is 2+2?,4\nCapital of Peru?,Lima\n"
    answer = client.post("/api/enhancement/datasets/", {
        "name": "faq", "file": SimpleUploadedFile("faq.csv", content.encode()), "instruction_column": "question",
        "output_column": "answer", "validation_share": 0.5}, format="multipart")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["source_format"] == "csv" and answer.json()["sample_count"] == 2
    missing = client.post("/api/enhancement/datasets/", {
        "name": "faq2", "file": SimpleUploadedFile("faq.csv", content.encode())}, format="multipart")
    assert missing.status_code == 400
    assert "no column 'instruction', 'output'; its columns are question, answer" in missing.json()["error"]["message"]


def test_uploading_again_under_the_same_name_is_a_new_version(client):
    first = upload(client, "faq", [{"instruction": "a", "output": "b"}] * 3)
    second = upload(client, "faq", [{"instruction": "c", "output": "d"}] * 5)
    assert first.json()["id"] == second.json()["id"]
    assert second.json()["sample_count"] == 5 and first.json()["sha256"] != second.json()["sha256"]
    asset = Asset.objects.get(workspace=client.workspace, kind="dataset")
    assert asset.latest_version == 2
    assert [v.summary["samples"] for v in asset.versions.all()] == [5, 3]


def test_the_shipped_sample_is_added_through_the_upload_path(client):
    answer = client.post("/api/enhancement/datasets/sample/")
    assert answer.status_code == 201
    lines = SAMPLE_DATASET.read_text(encoding="utf-8").splitlines()
    assert answer.json()["sample_count"] == len(lines) >= 250
    assert any("\u4e00" <= ch <= "\u9fff" for ch in SAMPLE_DATASET.read_text(encoding="utf-8"))


def test_the_preview_renders_samples_with_the_models_chat_template_and_counts_tokens(client, smollm2):
    dataset = upload(client, "greetings", [{"instruction": "Say hi", "output": "Hi there!"}] * 6 +
                     [{"instruction": "Tell a long story", "output": "word " * 300}]).json()
    answer = client.get(f"/api/enhancement/datasets/{dataset['id']}/preview/",
                        {"model": smollm2.name, "cutoff": 64})
    assert answer.status_code == 200, answer.json()
    preview = answer.json()
    assert preview["samples"][0].startswith("<|im_start|>")
    assert "<|im_start|>assistant\n" in preview["samples"][0]
    assert preview["histogram"]["over_cutoff"] == 1
    assert preview["histogram"]["over_cutoff_share"] == pytest.approx(1 / 7)
    assert sum(b["count"] for b in preview["histogram"]["bins"]) == 7


def test_a_preview_with_an_external_model_is_a_clear_400(client, smollm2):
    from serving.models import Model

    external = Model.objects.create(workspace=client.workspace, name="remote", kind="external",
                                    url="https://api.example.com/v1")
    dataset = upload(client, "tiny", [{"instruction": "a", "output": "b"}] * 2).json()
    answer = client.get(f"/api/enhancement/datasets/{dataset['id']}/preview/", {"model": external.name})
    assert answer.status_code == 400
    assert "is an external endpoint" in answer.json()["error"]["message"]
