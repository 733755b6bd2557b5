"""A fine-tune job planned across two nodes trains one data-parallel worker per node on Ray Train (TorchTrainer,
gloo on CPU). The Ray cluster is a real one of two Ray nodes on this machine (Ray's own `cluster_utils.Cluster`,
one raylet per node), reached through RAY_ADDRESS by the first node's worker, as on a pool; its result is a model
like any other job's."""

import re
import signal

import pytest

from cluster import inventory
from cluster.services import register_node
from enhancement.models import MetricSample
from enhancement.runner import run_dir
from tests.conftest import platform_env, wait_for
from tests.enhancement.conftest import finished, node_worker

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
HEAD, OTHER = "ray-head-node", "ray-other-node"


@pytest.fixture
def ray_cluster():
    from ray.cluster_utils import Cluster

    # Two CPUs each: both workers would fit on one node, so only the plan's spread puts one on each.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.mark.timeout(600)
def test_a_job_planned_across_two_nodes_trains_one_worker_on_each_over_ray(tuner, ray_cluster, web_port):
    for node in (HEAD, OTHER):
        register_node(name=node, resources=inventory.probe())
    worker = node_worker(HEAD, {**platform_env(web_port), "RAY_ADDRESS": ray_cluster.address})
    try:
        answer = tuner.post("/api/enhancement/jobs/", {
            "name": "across-nodes", "base_model": "smollm2-135m-instruct", "dataset": tuner.dataset.pk,
            "node": HEAD, "more_nodes": [OTHER], "quantizations": ["q8_0"],
            "hyperparameters": {"batch_size": 2, "cutoff": 96, "max_steps": 3, "save_steps": 2, "eval_steps": 4}},
            format="json")
        assert answer.status_code == 201, answer.json()
        job = answer.json()
        assert job["hyperparameters"]["workers"] == 2 and job["plan"]["chosen"]["nodes"] == 2
        done = wait_for(lambda: finished(job["id"]), timeout=540, interval=1, what="the Ray job to finish")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)

    log = (run_dir(done) / "train.log").read_text()
    assert done.state == "succeeded", f"{done.error}\n{log[-3000:]}"
    assert f"Training on 2 data-parallel workers (gloo) on the Ray cluster at {ray_cluster.address}" in log
    # STRICT_SPREAD: the two ranks ran on different Ray nodes.
    placed = dict(re.findall(r"Rank (\d) runs on Ray node ([0-9a-f]+)", log))
    assert sorted(placed) == ["0", "1"] and placed["0"] != placed["1"], log[-3000:]
    samples = MetricSample.objects.filter(job=done)
    assert sorted(samples.exclude(train_loss=None).values_list("step", flat=True)) == [1, 2, 3]
    assert samples.get(step=3).samples_per_s > 0 and samples.get(step=3).tokens_per_s > 0
    detail = tuner.get(f"/api/enhancement/jobs/{done.pk}/").json()
    assert [o["name"] for o in detail["outputs"]] == [f"{done.name}-q8-0"]
