"""f16 against Q8_0 against Q4_K_M of the instruction-tuned Gemma-3-270M: file size, decode tokens/s and perplexity
of the same held-out answers, each measured by llama.cpp (the engine that serves them). Targets: perplexity of Q8_0
≤ 1.01 × f16's, Q4_K_M's ≤ 1.05 ×.

    .venv/bin/python -m bench.quantize [--run-dir DIR] [--steps 10] [--heldout-tokens 2048] [--prompts 8]
                                       [--rounds 2]

Without --run-dir it first tunes the Gemma preset (LoRA, --steps steps on the shipped dataset, its validation split
held out) with the job's own process and exports the three GGUFs, as a fine-tune job does; with --run-dir it
measures the GGUFs of that job run (model-f16.gguf, and Q8_0/Q4_K_M made from it when missing). Perplexity is of the
validation split's answers given their prompts, rendered with Gemma's chat template; decode speed is greedy answers
to its questions. The models are measured in turn, --rounds times, so each sees the same load on a shared machine.
"""

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
django.setup()

from bench.helpers.training import hyperparameters, run_job_process, sample_dataset  # noqa: E402
from enhancement.training import evaluate, export  # noqa: E402
from serving.presets import GEMMA3_CHAT_TEMPLATE, _gemma3_path  # noqa: E402

KINDS = ("f16", "q8_0", "q4_k_m")
VALIDATION = 29  # the shipped dataset's 10% split, as a job would hold out


def gemma_spec(work: Path, steps: int) -> dict:
    base = str(_gemma3_path())
    data = str(sample_dataset(work))
    return {"kind": "finetune", "method": "lora", "stop_after": "export", "base_path": base, "base_gguf": base,
            "base_quantization": "Q4_K_M", "chat_template": GEMMA3_CHAT_TEMPLATE, "tokenizer_path": base,
            "quantizations": list(KINDS), "dataset_path": data, "validation_count": VALIDATION,
            "eval_dataset_path": data, "eval_validation_count": VALIDATION,
            "hyperparameters": hyperparameters(max_steps=steps, micro_batch_size=4, cutoff=256)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--heldout-tokens", type=int, default=2048)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run_dir
        if run_dir is None:
            run_dir = Path(scratch) / "tune"
            tuned = run_job_process(run_dir, gemma_spec(Path(scratch), args.steps))
            print(f"Tuned Gemma-3-270M: {len(tuned.step_times)} LoRA steps, loss {tuned.losses[0]:.2f} → "
                  f"{tuned.losses[-1]:.2f}, {tuned.wall_s:.0f} s with merge and export")
        spec = json.loads((run_dir / "spec.json").read_text())
        paths = {kind: run_dir / f"model-{kind}.gguf" for kind in KINDS}
        for kind in KINDS[1:]:
            if not paths[kind].exists():
                export.quantize(paths["f16"], paths[kind], kind)
        heldout, prompts = evaluate.eval_material(spec, max_prompts=args.prompts)
        rows = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                rows[kind].append(evaluate.measure(str(paths[kind]), heldout, prompts,
                                                   heldout_tokens=args.heldout_tokens))
    f16_perplexity = rows["f16"][0]["perplexity"]
    print(f"{rows['f16'][0]['heldout_tokens']} held-out answer tokens, {len(prompts)} prompts, {args.rounds} "
          f"round(s), {os.cpu_count()} cores")
    print(f"{'type':>7} {'size MiB':>9} {'decode tok/s':>12} {'prefill tok/s':>13} {'perplexity':>10} "
          f"{'vs f16':>7} {'target':>7} {'token-F1':>8}")
    for kind, measured in rows.items():
        perplexity = measured[0]["perplexity"]  # the same every round: greedy, same text
        ratio = perplexity / f16_perplexity
        target = {"f16": "", "q8_0": "≤ 1.01", "q4_k_m": "≤ 1.05"}[kind]
        print(f"{kind:>7} {measured[0]['size_bytes'] / 2 ** 20:>9.1f} "
              f"{statistics.median(m['decode_tokens_per_s'] for m in measured):>12.1f} "
              f"{statistics.median(m['prefill_tokens_per_s'] for m in measured):>13.1f} {perplexity:>10.3f} "
              f"{ratio:>7.4f} {target:>7} {measured[0]['token_f1']:>8.3f}")


if __name__ == "__main__":
    main()
