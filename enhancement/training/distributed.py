"""The training stage as data-parallel workers on Ray Train: a `TorchTrainer` whose workers each run the same HF
Trainer as a single-process job (`run.fit`, through `run.ray_worker`), joined by torch.distributed (gloo on CPU,
nccl on GPU) that Ray sets up; rank 0 writes the checkpoints, metrics and the trained weights into the run directory.

The Ray cluster is the one at RAY_ADDRESS (Ray's own variable, from the worker's environment) when set; otherwise
a local Ray cluster is started inside the job's process, on its node, and goes with it. A job whose plan spans
nodes (services._planned_settings: one data-parallel worker per node's device) needs RAY_ADDRESS, and its workers
are placed on distinct Ray nodes (STRICT_SPREAD). The run directory must be
on storage every Ray node sees (it holds the spec, the data and the checkpoints); the workers import this project
from the same path, as every node has the same install.

Ray is an optional extra (`pip install -e .[ray]`, which setup installs); a job asking for several workers on a
node without it fails with that reason.
"""

import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from enhancement.training.bases import base_location

ROOT = Path(__file__).resolve().parents[2]


class RayMissing(RuntimeError):
    pass


def rank_and_place() -> tuple[int, str]:
    """This Ray Train worker's rank, and where it runs (said in the job's log)."""
    import ray
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    return rank, f"Rank {rank} runs on Ray node {ray.get_runtime_context().get_node_id()} ({socket.gethostname()})"


def train_on_ray(run, resume: Path | None, worker_loop: Callable[[dict], None]) -> None:
    """Run `worker_loop` (run.py's, which fits the model: passed in, since run.py is what calls this) on each
    data-parallel worker."""
    try:
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError as exc:
        raise RayMissing(f"This job trains on {run.hyper['workers']} workers, which needs Ray on its node "
                         f"(pip install -e .[ray]): {exc}")
    import torch

    workers = int(run.hyper["workers"])
    spans = run.spec.get("plan_nodes") or []
    if spans and not os.environ.get("RAY_ADDRESS"):
        raise RayMissing(f"The plan trains across the nodes {', '.join(spans)}, which needs a Ray cluster that spans "
                         f"them: start one (`ray start --head` on one node, `ray start --address` on the others) "
                         f"and set RAY_ADDRESS in the environment of {spans[0]}'s worker.")
    # A GGUF base (and teacher) is converted here, once, outside any process group: transformers writes a model's
    # files only on rank 0 of one, so a rank 1 that converted first published a directory without them.
    base_location(run.spec)
    if run.spec.get("teacher_path"):
        base_location(run.spec, key="teacher_path")
    cuda = torch.cuda.is_available()
    # Workers spread over nodes each use their own node's cores; on one node they share its cores.
    threads = 0 if spans else max(1, (os.cpu_count() or 1) // workers)
    env = {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    # A local cluster's sockets and logs go to a directory of this process's own (short: Unix socket paths are
    # limited), removed when it is done.
    local_dir = None
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env={"env_vars": env}, log_to_driver=True)
        where = f"the Ray cluster at {os.environ['RAY_ADDRESS']}"
    else:
        local_dir = Path(tempfile.gettempdir()) / f"ray-job-{os.getpid()}"
        ray.init(num_cpus=workers, num_gpus=torch.cuda.device_count() if cuda else 0, include_dashboard=False,
                 runtime_env={"env_vars": env}, log_to_driver=True, _temp_dir=str(local_dir))
        where = "a local Ray cluster"
    run.status("train", f"Training on {workers} data-parallel workers ({'nccl' if cuda else 'gloo'}) on {where}")
    try:
        trainer = TorchTrainer(
            worker_loop,
            train_loop_config={"run_dir": str(run.dir), "resume": str(resume) if resume else "",
                               "threads": 0 if cuda else threads},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=cuda,
                                         resources_per_worker=None if cuda else {"CPU": 1},
                                         placement_strategy="STRICT_SPREAD" if spans else "PACK"),
            torch_config=TorchConfig(backend="nccl" if cuda else "gloo"),
            run_config=RunConfig(name="train", storage_path=str(run.dir / "ray")))
        trainer.fit()
    finally:
        ray.shutdown()
        if local_dir is not None:
            shutil.rmtree(local_dir, ignore_errors=True)
