"""What a finished job keeps on disk, and deleting it: intermediates (checkpoints, adapter, merged weights, an f16
GGUF nobody asked for) go when the job finishes unless the user asked to keep them; deleting the job removes its
output models and frees its directory, and is refused while a deployment serves one of its outputs."""

import json
import os
import shutil

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.services import Actor
from cluster.models import Job
from cluster.services import run_job
from enhancement import runner
from enhancement.files import jobs_root
from enhancement.models import EnhancementJob
from enhancement.runner import disk_bytes, run_dir
from enhancement.services import import_sample_dataset
from serving.models import Model

pytestmark = pytest.mark.django_db
MIB = 1024 * 1024


@pytest.fixture
def client(make_workspace, key_client, this_node, smollm2):
    workspace = make_workspace("Tuning", owner="tuner")
    api = key_client("tuner", workspace)
    api.dataset = import_sample_dataset(actor=Actor(user=get_user_model().objects.get(username="tuner")),
                                        workspace=workspace)
    return api


def finished_job(client, smollm2, *, name: str = "tune", keep_intermediates: bool = False,
                 report: dict | None = None) -> EnhancementJob:
    """A fine-tune requested through the API whose process has written what a LoRA run writes (checkpoints, the
    adapter, the merged weights, the f16 GGUF, the asked-for q8_0 GGUF, its records), taken up by the worker."""
    answer = client.post("/api/enhancement/jobs/", {
        "name": name, "base_model": "smollm2-135m-instruct", "dataset": client.dataset.pk,
        "hyperparameters": {"max_steps": 4}, "quantizations": ["q8_0"],
        "keep_intermediates": keep_intermediates}, format="json")
    assert answer.status_code == 201, answer.json()
    job = EnhancementJob.objects.get(pk=answer.json()["id"])
    directory = run_dir(job)
    for intermediate in ("checkpoints/checkpoint-2/model.safetensors", "checkpoints/checkpoint-4/model.safetensors",
                         "adapter/adapter_model.safetensors", "merged/model.safetensors"):
        (directory / intermediate).parent.mkdir(parents=True, exist_ok=True)
        (directory / intermediate).write_bytes(os.urandom(4 * MIB))
    shutil.copyfile(smollm2.path, directory / "model-f16.gguf")
    output = directory / "model-q8_0.gguf"
    shutil.copyfile(smollm2.path, output)
    (directory / "train.log").write_text("[train] Step 4 of 4\n")
    (directory / "metrics.jsonl").write_text(json.dumps({"type": "step", "step": 4, "step_time_s": 1.0}) + "\n")
    (directory / "result.json").write_text(json.dumps({
        "outputs": [{"quantization": "q8_0", "path": str(output), "size_bytes": output.stat().st_size}],
        "report": report or {"rows": [], "prompts": 0}}))
    run_job(job_id=job.cluster_job_id, worker="test")
    return job


def test_a_finished_job_keeps_its_output_and_records_but_not_its_intermediates(client, smollm2):
    job = finished_job(client, smollm2)

    left = sorted(entry.name for entry in run_dir(job).iterdir())
    assert left == ["metrics.jsonl", "model-q8_0.gguf", "result.json", "train.log"]
    detail = client.get(f"/api/enhancement/jobs/{job.pk}/").json()
    assert detail["state"] == "succeeded" and detail["keep_intermediates"] is False
    assert detail["disk_bytes"] == disk_bytes(run_dir(job)) < os.path.getsize(smollm2.path) + MIB


def test_intermediates_stay_when_the_user_asked_to_keep_them(client, smollm2):
    job = finished_job(client, smollm2, keep_intermediates=True)

    assert {"checkpoints", "adapter", "merged", "model-f16.gguf"} <= {e.name for e in run_dir(job).iterdir()}


def test_deleting_a_finished_fine_tune_frees_its_disk_and_removes_its_models(client, smollm2):
    job = finished_job(client, smollm2, keep_intermediates=True)
    directory = run_dir(job)
    held, before = disk_bytes(directory), disk_bytes(jobs_root())

    answer = client.delete(f"/api/enhancement/jobs/{job.pk}/")

    after = disk_bytes(jobs_root())
    print(f"\nthe job held {held} bytes; the jobs directory held {before} bytes before the delete and {after} after")
    assert answer.status_code == 204
    assert not directory.exists() and before - after == held >= 2 * os.path.getsize(smollm2.path)
    assert not Model.objects.filter(name="tune-q8-0").exists()
    assert client.get(f"/api/enhancement/jobs/{job.pk}/").status_code == 404


def test_a_job_whose_output_is_deployed_is_not_deleted_and_the_answer_names_the_deployment(client, smollm2):
    job = finished_job(client, smollm2)
    output = job.output_models.get()
    assert client.post(f"/api/serving/models/{output.pk}/deploy/").status_code == 201

    answer = client.delete(f"/api/enhancement/jobs/{job.pk}/")

    assert answer.status_code == 409
    assert f"deployment '{output.name}'" in answer.json()["error"]["message"]
    assert run_dir(job).exists() and EnhancementJob.objects.filter(pk=job.pk).exists()


def test_the_job_page_shows_its_disk_and_deletes_it_after_confirmation(client, smollm2):
    job = finished_job(client, smollm2)
    browser = Client()
    browser.login(username="tuner", password="correct-horse-battery")

    page = browser.get(f"/enhancement/jobs/{job.pk}/").content.decode()
    assert "On disk:" in page and "return confirm(this.dataset.confirm)" in page

    deleted = browser.post(f"/enhancement/jobs/{job.pk}/", {"action": "delete"}, follow=True).content.decode()
    assert "Deleted &#x27;tune&#x27; with its outputs and files" in deleted
    assert not EnhancementJob.objects.filter(pk=job.pk).exists() and not run_dir(job).exists()


def test_a_job_whose_rows_are_gone_counts_as_cancelled_so_its_supervisor_stops_the_process(client):
    """A workspace deleted (from the admin site, say) takes its cluster jobs with it: the node worker's loop over
    a running job must stop it rather than wait for a cancel no row can carry."""
    answer = client.post("/api/enhancement/jobs/", {
        "name": "orphan", "base_model": "smollm2-135m-instruct", "dataset": client.dataset.pk,
        "hyperparameters": {"max_steps": 4}}, format="json")
    job = EnhancementJob.objects.get(pk=answer.json()["id"])
    assert not runner.cancelled(job)
    Job.objects.filter(pk=job.cluster_job_id).delete()
    assert runner.cancelled(job)
