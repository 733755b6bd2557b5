"""How a finished job's outputs become models: the platform registers the files its job wrote (the user who asked
for the job is not a platform administrator, and the files are not in FACTORY_MODEL_DIRS), only from inside the
job's own run directory, and a job that cannot be finished says why."""

import json
import os
import shutil

import pytest
from django.contrib.auth import get_user_model

from accounts.errors import ValidationFailed
from accounts.services import Actor
from cluster.deadlines import sweep_overdue_jobs
from cluster.models import Node, NodeStatus
from cluster.services import run_job
from enhancement.models import EnhancementJob
from enhancement.runner import run_dir
from enhancement.services import import_sample_dataset
from serving.services import register_produced_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(make_workspace, key_client, this_node, smollm2):
    workspace = make_workspace("Tuning", owner="tuner")
    api = key_client("tuner", workspace)
    api.dataset = import_sample_dataset(actor=Actor(user=get_user_model().objects.get(username="tuner")),
                                        workspace=workspace)
    api.workspace = workspace
    api.owner = key_client("tuner", workspace, role="owner")  # reads the audit log
    return api


def queued_job(client) -> EnhancementJob:
    answer = client.post("/api/enhancement/jobs/", {
        "name": "tune", "base_model": "smollm2-135m-instruct", "dataset": client.dataset.pk,
        "hyperparameters": {"max_steps": 4}, "quantizations": ["q8_0"]}, format="json")
    assert answer.status_code == 201, answer.json()
    return EnhancementJob.objects.get(pk=answer.json()["id"])


def finish_with(job: EnhancementJob, output_path: str) -> None:
    """What the job's process leaves when it is done, then the node's worker taking the job up."""
    directory = run_dir(job)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "result.json").write_text(json.dumps({
        "outputs": [{"quantization": "q8_0", "path": output_path, "size_bytes": os.path.getsize(output_path)}],
        "report": {"rows": [], "prompts": 0, "heldout": "0 tokens"}}))
    run_job(job_id=job.cluster_job_id, worker="test")


def test_a_developers_job_output_is_registered_by_the_platform_in_their_workspace(client, smollm2):
    job = queued_job(client)
    exported = run_dir(job) / "model-q8_0.gguf"
    exported.parent.mkdir(parents=True)
    shutil.copyfile(smollm2.path, exported)

    finish_with(job, str(exported))

    detail = client.get(f"/api/enhancement/jobs/{job.pk}/").json()
    assert detail["state"] == "succeeded" and detail["stage"] == "done" and detail["error"] == ""
    assert [o["name"] for o in detail["outputs"]] == ["tune-q8-0"]
    models = {m["name"]: m for m in client.get("/api/serving/models/").json()["results"]}
    assert models["tune-q8-0"]["shared"] is False and models["tune-q8-0"]["supports_chat"]
    produced = client.owner.get("/api/audit/?action=model.produce").json()["results"]
    assert produced[0]["actor"] == "tuner" and produced[0]["detail"]["job"] == job.pk


def test_a_result_naming_a_file_outside_the_jobs_directory_registers_nothing_and_the_job_says_why(client, smollm2):
    job = queued_job(client)
    # A link inside the run directory that leads out of it is outside too.
    link = run_dir(job) / "model-q8_0.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(smollm2.path)

    finish_with(job, str(link))

    detail = client.get(f"/api/enhancement/jobs/{job.pk}/").json()
    assert detail["state"] == "failed" and detail["outputs"] == []
    assert "could not be registered" in detail["error"] and "outside enhancement's output directory" in detail["error"]
    assert "tune-q8-0" not in {m["name"] for m in client.get("/api/serving/models/").json()["results"]}


def test_only_registered_producers_and_their_own_directories_are_accepted(client, smollm2):
    with pytest.raises(ValidationFailed, match="not a model producer"):
        register_produced_model(producer="someone", workspace=client.workspace, name="x", path=smollm2.path,
                                requested_by=None)
    with pytest.raises(ValidationFailed, match="outside enhancement's output directory"):
        register_produced_model(producer="enhancement", workspace=client.workspace, name="x", path=smollm2.path,
                                requested_by=None)


def test_a_job_that_beat_gives_up_on_shows_the_reason(client, settings):
    job = queued_job(client)
    Node.objects.filter(pk=job.node_id).update(status=NodeStatus.UNHEALTHY)
    settings.CLUSTER_JOB_QUEUED_DEADLINE_S = 0

    sweep_overdue_jobs()

    detail = client.get(f"/api/enhancement/jobs/{job.pk}/").json()
    assert detail["state"] == "failed"
    assert f"Node '{job.node.name}' is unhealthy" in detail["error"]
