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

ROOT = Path(__file__).resolve().parents[2]


# The ChatML template SmolLM2 serves with, for the two-layer model below.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


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


def tiny_model(directory: Path, dataset: Path, *, vocabulary: int = 512) -> Path:
    """A two-layer Llama with random weights (hidden size 64) and a byte-level BPE tokenizer of `vocabulary` tokens
    trained on `dataset`'s texts, with ChatML's special tokens and template: a model whose training step takes
    milliseconds on a CPU, made here (nothing is downloaded)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [message["content"] for line in dataset.read_text(encoding="utf-8").splitlines()
             for message in json.loads(line)["messages"]]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocabulary, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def hyperparameters(**overrides) -> dict:
    return {"max_steps": 6, "learning_rate": 2e-4, "lr_scheduler": "constant", "warmup_steps": 0,
            "micro_batch_size": 4, "gradient_accumulation": 1, "cutoff": 256, "lora_rank": 8, "lora_alpha": 16,
            "lora_dropout": 0.0, "lora_targets": ["q_proj", "v_proj"], "seed": 1, "save_steps": 10_000,
            "eval_steps": 10_000, "recompute": False, **overrides}


def run_job_process(run_dir: Path, spec: dict, *, root: Path = ROOT,
                    command: tuple[str, ...] = ("-m", "enhancement.training.run")) -> TrainingRun:
    """Run the job's process on `spec` in `run_dir`; its peak RSS is the kernel's count for that child alone.
    `root`: the checkout whose runner runs (another commit's worktree, to compare); `command`: what the interpreter
    runs, given the run directory."""
    import time

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    began = time.monotonic()
    with (run_dir / "train.log").open("wb") as log:
        child = subprocess.Popen([sys.executable, *command, str(run_dir)], cwd=root,
                                 env={**os.environ, "PYTHONPATH": str(root)}, stdout=log, stderr=subprocess.STDOUT)
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
