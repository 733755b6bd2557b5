"""The pool on a real worker with real fine-tunes (tiny LoRA runs of the SmolLM2 preset on CPU slots): workspace A's
low-priority job fills the pool, workspace B's urgent job arrives, A's job checkpoints at its next step and is
requeued (or, elastic, shrinks), B's starts within one scheduling interval, and when B is done A resumes from its
checkpoint (or grows back) and finishes, having trained each step once, with the final loss of the same job run
alone. Minutes each (the elastic one trains on Ray Train workers), so `slow`."""

import time

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import override_settings
from rest_framework.test import APIClient

from accounts.services import Actor, create_api_key, create_workspace
from cluster import inventory
from cluster.models import Workload, WorkloadState
from cluster.scheduling import pool
from cluster.services import register_node
from enhancement.models import EnhancementJob, MetricSample
from enhancement.runner import run_dir
from enhancement.services import import_sample_dataset
from tests.conftest import platform_env, wait_for
from tests.enhancement.conftest import finished, node_worker, tuner  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
# The elastic job's steps: enough to be still training, shrunk to 1 worker, when the urgent job is done.
STEPS = 40


def submit(client, node: str, name: str, dataset, *, priority: str, max_steps: int, **hyper) -> EnhancementJob:
    answer = client.post("/api/enhancement/jobs/", {
        "name": name, "base_model": "smollm2-135m-instruct", "dataset": dataset.pk, "node": node,
        "priority": priority, "quantizations": ["q8_0"],
        "hyperparameters": {"batch_size": 2, "cutoff": 96, "save_steps": 2, "eval_steps": 100,
                            "max_steps": max_steps, **hyper}}, format="json")
    assert answer.status_code == 201, answer.json()
    return EnhancementJob.objects.get(pk=answer.json()["id"])


def workload(job: EnhancementJob) -> Workload:
    return Workload.objects.get(job_id=job.cluster_job_id)


def story(job: EnhancementJob) -> str:
    """What a failed wait shows: the job's events, its workload and its training log's end."""
    job.refresh_from_db()
    events = "\n".join(f"{e.at:%H:%M:%S} {e.state} {e.message}" for e in job.cluster_job.events.all())
    log = run_dir(job) / "train.log"
    return (f"{job.state} {job.stage} step {job.step}; workload {workload(job).__dict__}\n{events}\n"
            f"{log.read_text()[-2000:] if log.exists() else ''}")


def cpu_slots(node: str, count: int) -> None:
    register_node(name=node, resources=inventory.Resources(
        hostname=node, cpu_cores=count, memory_bytes=8 * 2**30, memory_available_bytes=4 * 2**30,
        load_average=[0.0, 0.0, 0.0]))


def team_b() -> tuple[APIClient, object]:
    """Workspace B's owner (who may use the urgent class) as an API client, and B's dataset."""
    owner = get_user_model().objects.create_user(username="urgent-owner", password="x" * 12)
    workspace = create_workspace(actor=Actor(user=owner), name="Team B")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + create_api_key(
        actor=Actor(user=owner), workspace=workspace, name="k", role="owner").secret)
    return client, import_sample_dataset(actor=Actor(user=owner), workspace=workspace)


def test_an_urgent_job_takes_the_slot_from_a_low_one_which_resumes_from_its_checkpoint(tuner,  # noqa: F811
                                                                                        celery_worker_process):
    node = celery_worker_process["node"]
    cpu_slots(node, 1)  # one CPU slot: A's job fills the pool
    urgent_client, dataset_b = team_b()

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


@pytest.mark.timeout(1500)
def test_an_elastic_job_shrinks_for_an_urgent_one_and_grows_back_when_it_ends(tuner, celery_worker_process,  # noqa: F811
                                                                              web_port):
    node = celery_worker_process["node"]
    cpu_slots(node, 2)  # A's elastic job (1 to 2 data-parallel workers) takes both slots
    urgent_client, dataset_b = team_b()
    # A second worker on the node's queue: A, shrunk, and B train side by side.
    second = node_worker(node, platform_env(web_port))
    try:
        elastic = submit(tuner, node, "elastic-low", tuner.dataset, priority="low", max_steps=STEPS, workers=2,
                         min_workers=1)
        assert workload(elastic).devices == 2
        wait_for(lambda: EnhancementJob.objects.get(pk=elastic.pk).step >= 3, timeout=600, interval=0.5,
                 what="A's job to pass its first checkpoint on 2 workers")

        asked_at = time.monotonic()
        urgent = submit(urgent_client, node, "hotfix", dataset_b, priority="urgent", max_steps=2)
        shrinking = workload(elastic)
        assert shrinking.state == WorkloadState.STOPPING and sum(shrinking.stop_keep.values()) == 1
        wait_for(lambda: workload(urgent).state == WorkloadState.RUNNING, timeout=180, interval=0.2,
                 what="B's urgent job to be admitted")
        admitted_after = time.monotonic() - asked_at
        assert admitted_after <= settings.POOL_INTERVAL_S, f"B waited {admitted_after:.1f} s"
        shrunk = workload(elastic)
        assert shrunk.state == WorkloadState.RUNNING and shrunk.devices == 1, "shrunk, not stopped"
        shrunk_at = EnhancementJob.objects.get(pk=elastic.pk).step

        assert wait_for(lambda: finished(urgent), timeout=900, interval=1, what="B's job").state == "succeeded"
        # The next pass (beat's tick, here by hand) finds the slot free: A grows back at its next checkpoint.
        with override_settings(POOL_MIN_RUN_S=0):
            pool.schedule_now()
        growing = workload(elastic)
        assert growing.state == WorkloadState.STOPPING and growing.devices == 2, story(elastic)
        try:
            wait_for(lambda: workload(elastic).state == WorkloadState.RUNNING, timeout=300, interval=0.5,
                     what="A to restart on 2 workers")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{story(elastic)}") from None
        grown_at = EnhancementJob.objects.get(pk=elastic.pk).step
        resumed = wait_for(lambda: finished(elastic), timeout=900, interval=1, what="A's job to finish")
    finally:
        second.terminate()
        second.wait(timeout=30)
    log = (run_dir(elastic) / "train.log").read_text()
    assert resumed.state == "succeeded", f"{resumed.error}\n{log[-3000:]}"
    # Started on 2 workers, restarted on 1 (shrunk), then on 2 again (grown), each time from its last checkpoint.
    assert log.count("Resuming from checkpoint-") == 2, log[-3000:]
    assert log.count("Training on 2 data-parallel workers") == 2, log[-3000:]
    steps = list(MetricSample.objects.filter(job=elastic).order_by("step").values_list("step", flat=True))
    assert steps == sorted(set(steps)) and {1, STEPS} <= set(steps), "each step trained once"

    alone = submit(tuner, node, "elastic-alone", tuner.dataset, priority="low", max_steps=STEPS, workers=2,
                   min_workers=1)
    assert wait_for(lambda: finished(alone), timeout=900, interval=1, what="the job run alone").state == "succeeded"
    resized_loss = MetricSample.objects.get(job=elastic, step=STEPS).train_loss
    alone_loss = MetricSample.objects.get(job=alone, step=STEPS).train_loss
    assert abs(resized_loss - alone_loss) <= 0.05 * alone_loss, (resized_loss, alone_loss)
    print(f"\nB admitted {admitted_after:.1f} s after it asked; A shrank to 1 worker at step {shrunk_at}, grew "
          f"back to 2 at step {grown_at}, train loss {resized_loss:.4f} at step {STEPS}; alone: {alone_loss:.4f}")
