"""What the enhancement benchmarks share: the job's own process (`python -m enhancement.training.run`) on a spec
written here, with no database, and its figures read back from the metrics it logs."""

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from enhancement.files import SAMPLE_DATASET
from enhancement.formats import parse_jsonl

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class TrainingRun:
    step_times: list[float]
    tokens_per_s: list[float]
    losses: list[float]
    peak_rss_bytes: int
    wall_s: float
    run_dir: Path

    @property
    def median_step_s(self) -> float:
        # The first step warms up (allocations, thread pools).
        return statistics.median(self.step_times[1:] or self.step_times)

    @property
    def median_tokens_per_s(self) -> float:
        return statistics.median(self.tokens_per_s[1:] or self.tokens_per_s)


def sample_dataset(directory: Path) -> Path:
    """The shipped instruction dataset in its stored form (one {"messages": [...]} per line)."""
    _, conversations = parse_jsonl(SAMPLE_DATASET.read_bytes())
    path = directory / "data.jsonl"
    path.write_text("".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in conversations),
                    encoding="utf-8")
    return path


def hyperparameters(**overrides) -> dict:
    return {"max_steps": 6, "learning_rate": 2e-4, "lr_scheduler": "constant", "warmup_steps": 0,
            "micro_batch_size": 4, "gradient_accumulation": 1, "cutoff": 256, "lora_rank": 8, "lora_alpha": 16,
            "lora_dropout": 0.0, "lora_targets": ["q_proj", "v_proj"], "seed": 1, "save_steps": 10_000,
            "eval_steps": 10_000, "recompute": False, **overrides}


def run_job_process(run_dir: Path, spec: dict) -> TrainingRun:
    """Run the job's process on `spec` in `run_dir`; its peak RSS is the kernel's count for that child alone."""
    import time

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    began = time.monotonic()
    with (run_dir / "train.log").open("wb") as log:
        child = subprocess.Popen([sys.executable, "-m", "enhancement.training.run", str(run_dir)], cwd=ROOT,
                                 stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - began
    if os.waitstatus_to_exitcode(status) != 0:
        tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"The job process failed in {run_dir}:\n{tail}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    return TrainingRun(step_times=[r["step_time_s"] for r in steps],
                       tokens_per_s=[r["tokens_per_s"] for r in steps if r.get("tokens_per_s")],
                       losses=[r["train_loss"] for r in records if "train_loss" in r],
                       peak_rss_bytes=usage.ru_maxrss * 1024, wall_s=wall, run_dir=run_dir)
