"""Fine-tune jobs on real Celery workers: a LoRA run of SmolLM2 that resumes after its worker and its training
process are killed (and trains each step once), and a cancel that kills the training process group."""

import os
import signal
from pathlib import Path

import pytest
from celery import current_app

from cluster import inventory
from cluster.services import register_node
from enhancement.files import converted_bases_dir
from enhancement.models import EnhancementJob, MetricSample
from enhancement.runner import is_running, run_dir
from serving.engines import process
from serving.gguf_info import read_gguf
from tests.conftest import platform_env, wait_for
from tests.enhancement.conftest import finished, node_worker, start

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]
KILL_NODE = "enh-kill-node"


@pytest.mark.slow
def test_a_job_killed_with_its_worker_resumes_from_its_checkpoint_and_trains_each_step_once(tuner, web_port):
    register_node(name=KILL_NODE, resources=inventory.probe())
    env = {**platform_env(web_port), "FACTORY_JOB_HEARTBEAT_S": "2"}
    worker = node_worker(KILL_NODE, env)
    job = start(tuner, KILL_NODE, max_steps=8)
    wait_for(lambda: EnhancementJob.objects.get(pk=job.pk).step >= 3, timeout=240, interval=0.5,
             what="training to pass its first checkpoint")
    job.refresh_from_db()
    training_pid = job.pid

    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    assert process.is_alive(training_pid), "the training process must outlive its worker"
    # Then the machine's training dies too: a new worker must resume it from the checkpoint.
    os.killpg(training_pid, signal.SIGKILL)
    wait_for(lambda: not process.is_alive(training_pid), timeout=10, what="the training process to die")
    checkpoints = sorted(p.name for p in (run_dir(job) / "checkpoints").glob("checkpoint-*"))
    assert checkpoints, "a checkpoint was written every 2 steps"

    replacement = node_worker(KILL_NODE, env)
    try:
        # What Redis (or beat's sweep of jobs whose worker stopped its heartbeat) does with a job whose worker is
        # gone: its message is delivered again, until a worker takes it up.
        def taken_up() -> bool:
            current_app.send_task("cluster.tasks.run_job", args=[job.cluster_job_id], queue=f"node.{KILL_NODE}")
            try:
                return wait_for(lambda: EnhancementJob.objects.get(pk=job.pk).pid != training_pid, timeout=10,
                                interval=0.5, what="a worker to take the job up")
            except AssertionError:
                return False

        wait_for(taken_up, timeout=150, interval=0, what="the job to be redelivered")
        done = wait_for(lambda: finished(job), timeout=420, interval=1, what="the resumed job to finish")
    finally:
        os.killpg(replacement.pid, signal.SIGTERM)
        replacement.wait(timeout=30)
    assert done.state == "succeeded", f"{done.error}\n{(run_dir(job) / 'train.log').read_text()[-3000:]}"

    log = (run_dir(job) / "train.log").read_text()
    assert log.count("Training from step 0") == 1
    assert "Resuming from checkpoint-" in log
    steps = list(MetricSample.objects.filter(job=job).order_by("step").values_list("step", flat=True))
    assert steps == sorted(set(steps)) and {1, 8} <= set(steps)
    samples = MetricSample.objects.filter(job=job)
    assert samples.exclude(train_loss=None).count() == 8
    assert samples.exclude(validation_loss=None).exists()
    assert samples.filter(step=8).values_list("tokens_per_s", flat=True)[0] > 0
    # The GGUF base was de-quantized once, for training, the resumed training and the merge alike.
    assert len(list(converted_bases_dir().glob("*/model.safetensors"))) == 1

    detail = tuner.get(f"/api/enhancement/jobs/{job.pk}/").json()
    assert [o["name"] for o in detail["outputs"]] == [f"tune-{KILL_NODE}-q8-0"]
    output = done.output_models.get()
    assert output.quantization == "Q8_0"
    # The served chat template travels inside the exported GGUF.
    assert "<|im_start|>" in read_gguf(Path(output.path)).chat_template
    rows = {row["quantization"]: row for row in detail["report"]["rows"]}
    assert set(rows) == {"Q4_1", "q8_0"}
    for row in rows.values():
        assert row["perplexity"] > 1 and row["decode_tokens_per_s"] > 0 and row["size_bytes"] > 0
    assert rows["q8_0"]["perplexity_ratio"] > 0


def test_cancel_kills_the_training_process_group(tuner, celery_worker_process):
    job = start(tuner, celery_worker_process["node"], max_steps=500)
    wait_for(lambda: EnhancementJob.objects.get(pk=job.pk).step >= 1, timeout=240, interval=0.5,
             what="training to start")
    job.refresh_from_db()
    pid = job.pid

    answer = tuner.post(f"/api/enhancement/jobs/{job.pk}/cancel/")

    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    wait_for(lambda: not process.is_alive(pid), timeout=15, what="the training process group to be killed")
    job.refresh_from_db()
    assert not is_running(job) and not job.output_models.exists()
    assert tuner.post(f"/api/enhancement/jobs/{job.pk}/cancel/").status_code == 409
