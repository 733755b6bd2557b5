"""An app's up-voted answers exported as a fine-tuning dataset (Model enhancement), from the API and the logs page."""

import json

import pytest
from django.test import Client

from enhancement.files import dataset_path
from enhancement.models import Dataset
from runtime.models import Channel, Feedback, Trace, TraceStatus

pytestmark = pytest.mark.django_db


def answered(app, query: str, answer: str, rating: int | None, status: str = TraceStatus.OK) -> Trace:
    trace = Trace.objects.create(app=app, release=app.current_release, channel=Channel.CHAT, query=query,
                                 answer=answer, status=status)
    if rating is not None:
        Feedback.objects.create(trace=trace, rating=rating)
    return trace


def test_up_voted_answers_become_a_dataset_of_the_apps_workspace(acme, app, key_client):
    api = key_client("ann", acme)
    assert api.post("/api/runtime/apps/handbook/feedback-dataset/", {}, format="json").json()["error"][
        "message"] == "No up-voted answer of 'handbook' to export yet."
    answered(app, "How many leave days?", "25 days a year.", rating=1)
    answered(app, "Who approves leave?", "Your manager.", rating=1)
    answered(app, "Where is the office?", "On the moon.", rating=-1)
    answered(app, "Any parking?", "", rating=None)
    answered(app, "Broken?", "half an answer", rating=1, status=TraceStatus.ERROR)

    exported = api.post("/api/runtime/apps/handbook/feedback-dataset/", {}, format="json")

    assert exported.status_code == 201, exported.json()
    assert exported.json()["name"] == "handbook-feedback" and exported.json()["sample_count"] == 2
    dataset = api.get(f"/api/enhancement/datasets/{exported.json()['dataset']}/").json()
    assert dataset["source_format"] == "messages" and dataset["train_count"] + dataset["validation_count"] == 2
    stored = [json.loads(line)["messages"] for line in dataset_path(dataset["sha256"]).read_text().splitlines()]
    assert sorted(m[0]["content"] + " → " + m[1]["content"] for m in stored) == [
        "How many leave days? → 25 days a year.", "Who approves leave? → Your manager."]
    viewer = key_client("dev", acme, role="viewer")  # a read-only key
    assert viewer.post("/api/runtime/apps/handbook/feedback-dataset/", {}, format="json").status_code == 403


def test_the_logs_page_exports_them_and_opens_the_dataset(acme, app):
    answered(app, "How many leave days?", "25 days a year.", rating=1)
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    assert b"Export the up-voted answers as a fine-tuning dataset" in client.get("/apps/handbook/logs/").content

    exported = client.post("/apps/handbook/logs/", {"dataset_name": "leave answers"})

    dataset = Dataset.objects.get(workspace=acme, name="leave answers")
    assert exported.status_code == 302 and exported.url == f"/enhancement/datasets/{dataset.pk}/"
    # The message shows on the next page drawn (the dataset page's preview, which tests/enhancement/test_datasets.py
    # checks, first converts SmolLM2's tokenizer: over ten seconds on two cores).
    assert "Exported 1 up-voted answer(s) of &#x27;handbook&#x27; as dataset &#x27;leave answers&#x27;." in \
        client.get("/apps/handbook/logs/").content.decode()
