"""A fine-tune job with two data-parallel workers runs on Ray Train (TorchTrainer, gloo on CPU) on a local Ray
cluster that the job's process starts on its node, and its result is a model like any other job's."""

import pytest

from enhancement.models import MetricSample
from enhancement.runner import run_dir
from tests.conftest import wait_for
from tests.enhancement.conftest import finished, start

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.mark.timeout(600)
def test_a_two_worker_job_trains_data_parallel_on_a_local_ray_cluster(tuner, celery_worker_process):
    job = start(tuner, celery_worker_process["node"], max_steps=3, workers=2, micro_batch_size=1)
    assert job.hyperparameters["gradient_accumulation"] == 1  # two workers take one sample each per step

    done = wait_for(lambda: finished(job), timeout=540, interval=1, what="the Ray job to finish")

    log = (run_dir(job) / "train.log").read_text()
    assert done.state == "succeeded", f"{done.error}\n{log[-3000:]}"
    assert "Training on 2 data-parallel workers (gloo) on a local Ray cluster" in log
    assert "world_rank=0" in log and "world_rank=1" in log
    samples = MetricSample.objects.filter(job=job)
    assert sorted(samples.exclude(train_loss=None).values_list("step", flat=True)) == [1, 2, 3]
    # Rank 0 reports each step once, counting both workers' samples.
    assert samples.get(step=3).samples_per_s > 0 and samples.get(step=3).tokens_per_s > 0
    detail = tuner.get(f"/api/enhancement/jobs/{job.pk}/").json()
    assert [o["name"] for o in detail["outputs"]] == [f"{job.name}-q8-0"]
