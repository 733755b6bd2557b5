"""What a job's page tells: its real phase (not "Queued" or "step 0 of 0" once a worker has it), why a quantized output
is larger than its base, a report measured on training data said to be so, unticked exports not exported, and a
step-time estimate calibrated on the steps a job of the same model measured."""

import json
from datetime import datetime, timezone

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.services import Actor
from cluster.models import JobState
from cluster.services import _transition, run_job
from enhancement import services
from enhancement.models import EnhancementJob, MetricSample
from enhancement.runner import run_dir
from tests.enhancement.test_job_delete import client, finished_job  # noqa: F401  (the fixture, and a helper)

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(client):  # noqa: F811
    signed_in = Client(HTTP_ACCEPT_LANGUAGE="en")
    signed_in.login(username="tuner", password="correct-horse-battery")
    return signed_in


def test_a_job_its_worker_took_up_says_starting_and_shows_no_step_count(client, browser):  # noqa: F811
    answer = client.post("/api/enhancement/jobs/", {"name": "tune", "base_model": "smollm2-135m-instruct",
                                                    "dataset": client.dataset.pk}, format="json")
    job = EnhancementJob.objects.get(pk=answer.json()["id"])
    _transition(job.cluster_job, JobState.RUNNING, "taken up")

    page = browser.get(f"/enhancement/jobs/{job.pk}/").content.decode()
    live = browser.get(f"/enhancement/jobs/{job.pk}/live/").json()

    assert '<strong id="job-stage">Starting</strong>' in page and '<span id="job-steps" hidden>' in page
    assert live["stage"] == "Starting"


def test_unticked_exports_are_refused_not_replaced(client, browser):  # noqa: F811
    answer = client.post("/api/enhancement/jobs/", {"name": "tune", "base_model": "smollm2-135m-instruct",
                                                    "dataset": client.dataset.pk, "quantizations": []},
                         format="json")
    page = browser.post("/enhancement/jobs/new/", {
        "action": "start", "name": "tune", "base_model": "smollm2-135m-instruct", "dataset": client.dataset.pk,
        "method": "lora"}, follow=True).content.decode()

    assert answer.status_code == 400 and "Tick at least one export" in answer.json()["error"]["message"]
    assert "Tick at least one export" in page and not EnhancementJob.objects.exists()


def test_a_quantized_output_larger_than_its_base_says_why(client, browser, smollm2, this_node):  # noqa: F811
    owner = Actor(user=get_user_model().objects.get(username="tuner"))
    job = services.create_quantize_job(actor=owner, workspace=client.dataset.workspace, name="squeeze",
                                       base_model=smollm2, node=this_node, quantizations=["q8_0"])
    directory = run_dir(job)
    directory.mkdir(parents=True)
    output = directory / "model-q8_0.gguf"
    output.write_bytes(open(smollm2.path, "rb").read())
    rows = [{"model": "base", "quantization": "Q4_K_M", "size_bytes": 93_800_000, "perplexity": 9.0,
             "heldout_tokens": 120},
            {"model": "output", "quantization": "q8_0", "size_bytes": 100_600_000, "perplexity": 9.1}]
    (directory / "result.json").write_text(json.dumps({
        "outputs": [{"quantization": "q8_0", "path": str(output), "size_bytes": output.stat().st_size}],
        "report": {"rows": rows, "prompts": 4}}))
    run_job(job_id=job.cluster_job_id, worker="test")

    page = browser.get(f"/enhancement/jobs/{job.pk}/").content.decode()

    assert "Larger than the base: the base was already Q4_K_M, and Q8_0 keeps more bits per weight" in page


def test_a_report_on_a_dataset_without_validation_split_says_it_measured_training_data(client, browser,  # noqa: F811
                                                                                        smollm2):
    owner = Actor(user=get_user_model().objects.get(username="tuner"))
    services.upload_dataset(actor=owner, workspace=client.dataset.workspace, name=client.dataset.name,
                            filename="all.jsonl", content=open(services.SAMPLE_DATASET, "rb").read(),
                            validation_share=0)
    rows = [{"model": "base", "quantization": "Q8_0", "size_bytes": 1, "perplexity": 9.0, "heldout_tokens": 80},
            {"model": "output", "quantization": "q8_0", "size_bytes": 1, "perplexity": 0.02,
             "perplexity_ratio": 0.0019}]
    job = finished_job(client, smollm2, report={"rows": rows, "prompts": 4})

    page = browser.get(f"/enhancement/jobs/{job.pk}/").content.decode()

    assert "answer tokens of the training conversations (the dataset has no validation split)" in page
    assert "not that it generalises" in page and "vs base (training data)" in page
    assert "held-out" not in page


def test_the_next_plan_is_calibrated_on_the_steps_a_job_measured(client, browser, smollm2):  # noqa: F811
    first = finished_job(client, smollm2, name="first")
    planned = first.plan["chosen"]["step_time_s"]
    for step in (1, 2, 3):
        MetricSample.objects.create(job=first, step=step, at=datetime.now(timezone.utc), step_time_s=planned / 7)

    answer = client.post("/api/enhancement/jobs/", {"name": "second", "base_model": "smollm2-135m-instruct",
                                                    "dataset": client.dataset.pk}, format="json")
    second = EnhancementJob.objects.get(pk=answer.json()["id"])

    assert second.plan["calibration"]["job"] == "first"
    assert second.plan["chosen"]["step_time_s"] == pytest.approx(second.plan["chosen"]["raw_step_time_s"] / 7)
    first_page = browser.get(f"/enhancement/jobs/{first.pk}/").content.decode()
    assert f"measured {planned / 7:.2f} s (the median of its steps)" in first_page
    assert "Calibrated on job first" in browser.get(f"/enhancement/jobs/{second.pk}/").content.decode()
