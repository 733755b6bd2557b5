"""The pool on a real worker with real fine-tunes (tiny LoRA runs of the SmolLM2 preset on CPU slots): workspace A's
low-priority job fills the pool, workspace B's urgent job arrives, A's job checkpoints at its next step and is
requeued, B's starts within one scheduling interval, and when B is done A resumes from its checkpoint and finishes,
having trained each step once, with the final loss of the same job run alone."""

import time

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.services import Actor, create_api_key, create_workspace
from cluster import inventory
from cluster.models import Workload, WorkloadState
from cluster.services import register_node
from enhancement.models import EnhancementJob, MetricSample
from enhancement.runner import run_dir
from enhancement.services import import_sample_dataset
from tests.conftest import wait_for
from tests.enhancement.conftest import finished, tuner  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def submit(client, node: str, name: str, dataset, *, priority: str, max_steps: int) -> EnhancementJob:
    answer = client.post("/api/enhancement/jobs/", {
        "name": name, "base_model": "smollm2-135m-instruct", "dataset": dataset.pk, "node": node,
        "priority": priority, "quantizations": ["q8_0"],
        "hyperparameters": {"batch_size": 2, "cutoff": 96, "save_steps": 2, "eval_steps": 100,
                            "max_steps": max_steps}}, format="json")
    assert answer.status_code == 201, answer.json()
    return EnhancementJob.objects.get(pk=answer.json()["id"])


def workload(job: EnhancementJob) -> Workload:
    return Workload.objects.get(job_id=job.cluster_job_id)


def test_an_urgent_job_takes_the_slot_from_a_low_one_which_resumes_from_its_checkpoint(tuner,  # noqa: F811
                                                                                        celery_worker_process):
    node = celery_worker_process["node"]
    # One CPU slot: A's job fills the pool.
    register_node(name=node, resources=inventory.Resources(
        hostname=node, cpu_cores=1, memory_bytes=8 * 2**30, memory_available_bytes=4 * 2**30,
        load_average=[0.0, 0.0, 0.0]))
    owner = get_user_model().objects.create_user(username="urgent-owner", password="x" * 12)
    team_b = create_workspace(actor=Actor(user=owner), name="Team B")
    urgent_client = APIClient()
    urgent_client.credentials(HTTP_AUTHORIZATION="Bearer " + create_api_key(
        actor=Actor(user=owner), workspace=team_b, name="k", role="owner").secret)
    dataset_b = import_sample_dataset(actor=Actor(user=owner), workspace=team_b)

    low = submit(tuner, node, "sweep-low", tuner.dataset, priority="low", max_steps=12)
    assert workload(low).state == WorkloadState.RUNNING
    wait_for(lambda: EnhancementJob.objects.get(pk=low.pk).step >= 3, timeout=300, interval=0.5,
             what="A's job to pass its first checkpoint")

    asked_at = time.monotonic()
    urgent = submit(urgent_client, node, "hotfix", dataset_b, priority="urgent", max_steps=4)
    assert workload(low).state == WorkloadState.STOPPING
    wait_for(lambda: workload(urgent).state == WorkloadState.RUNNING, timeout=120, interval=0.2,
             what="B's urgent job to be admitted")
    admitted_after = time.monotonic() - asked_at
    assert admitted_after <= settings.POOL_INTERVAL_S, f"B waited {admitted_after:.1f} s"
    preempted = workload(low)
    assert preempted.state == WorkloadState.WAITING and preempted.preemptions == 1
    stopped_at = EnhancementJob.objects.get(pk=low.pk).step

    done = wait_for(lambda: finished(urgent), timeout=600, interval=1, what="B's job to finish")
    assert done.state == "succeeded", done.error
    resumed = wait_for(lambda: finished(low), timeout=900, interval=1, what="A's job to resume and finish")
    assert resumed.state == "succeeded", f"{resumed.error}\n{(run_dir(low) / 'train.log').read_text()[-3000:]}"

    log = (run_dir(low) / "train.log").read_text()
    assert "for the pool" in log and "Resuming from checkpoint-" in log
    steps = list(MetricSample.objects.filter(job=low).order_by("step").values_list("step", flat=True))
    assert steps == sorted(set(steps)) and {1, 12} <= set(steps), "each step trained once"

    # The same job run alone ends where the preempted one did: the resume kept optimizer, schedule and data order.
    alone = submit(tuner, node, "sweep-alone", tuner.dataset, priority="low", max_steps=12)
    assert wait_for(lambda: finished(alone), timeout=600, interval=1, what="the job run alone").state == "succeeded"
    resumed_loss = MetricSample.objects.get(job=low, step=12).train_loss
    alone_loss = MetricSample.objects.get(job=alone, step=12).train_loss
    assert abs(resumed_loss - alone_loss) <= 0.02 * alone_loss, (resumed_loss, alone_loss)
    print(f"\nB admitted {admitted_after:.1f} s after it asked; A stopped at step {stopped_at}, resumed and "
          f"finished with train loss {resumed_loss:.4f} at step 12; the same job alone: {alone_loss:.4f}")
