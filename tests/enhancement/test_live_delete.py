"""A real LoRA fine-tune of SmolLM2 on the test worker's node: once finished it holds only its output and records (the
checkpoints, adapter, merged weights and f16 GGUF are gone), and deleting it through the API frees what it held (the
node's worker removes the files, as on a node other than the web server's)."""

import pytest

from enhancement.files import jobs_root
from enhancement.models import EnhancementJob
from enhancement.runner import disk_bytes, run_dir
from tests.conftest import wait_for
from tests.enhancement.conftest import finished, start

# A real fine-tune (a minute here): `make test-all` runs it; tests/enhancement/test_job_delete.py covers the delete.
pytestmark = [pytest.mark.slow, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_finished_fine_tune_keeps_its_output_only_and_its_delete_frees_the_disk(tuner, celery_worker_process):
    job = start(tuner, celery_worker_process["node"], name="freed", max_steps=2)
    done = wait_for(lambda: finished(job), timeout=900, interval=1.0, what="the fine-tune to finish")
    assert done.state == "succeeded", f"{done.error}\n{(run_dir(done) / 'train.log').read_text()[-3000:]}"
    directory = run_dir(done)
    left = sorted(entry.name for entry in directory.iterdir())
    assert not {"checkpoints", "adapter", "merged", "model-f16.gguf"} & set(left), left
    held, before = disk_bytes(directory), disk_bytes(jobs_root())

    answer = tuner.delete(f"/api/enhancement/jobs/{done.pk}/")

    # The job ran on the worker's node, whose worker removes its files (a job of its own).
    wait_for(lambda: not directory.exists(), timeout=120, interval=0.5, what="the node's worker to remove the files")
    after = disk_bytes(jobs_root())
    print(f"\nfinished job '{done.name}' kept {left}; it held {held} bytes; the jobs directory held {before} bytes "
          f"before the delete and {after} after")
    assert answer.status_code == 204 and not directory.exists() and before - after == held
    assert not EnhancementJob.objects.filter(pk=done.pk).exists()
