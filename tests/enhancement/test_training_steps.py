"""The training runner's step: packed rows train exactly as their samples would one by one, the per-step figures are
written about once a second without stopping the step, and the runner works across the library versions it
supports and refuses others at start, in one line."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from bench.helpers.training import CHATML, hyperparameters, sample_dataset, tiny_model
from enhancement.training import batches, run, versions
from enhancement.training.data import IGNORE_INDEX
from tests.conftest import ROOT


def examples(lengths: list[int], *, vocabulary: int = 60, seed: int = 0) -> list[dict]:
    """Samples of the given lengths whose second half is the answer (labelled), the rest prompt (ignored)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for length in lengths:
        ids = torch.randint(3, vocabulary, (length,), generator=generator).tolist()
        out.append({"input_ids": ids, "labels": [IGNORE_INDEX] * (length // 2) + ids[length // 2:]})
    return out


def test_packing_puts_every_sample_in_exactly_one_row_within_the_cutoff_the_same_way_each_time():
    samples = examples([50, 120, 30, 200, 10, 90, 60, 256, 5, 40])
    rows = batches.pack(samples, 256)
    again = batches.pack(samples, 256)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(rows, again, strict=True))
    assert all(len(row["input_ids"]) <= 256 for row in rows)
    assert sum(row["samples"] for row in rows) == len(samples)
    assert sum(len(row["input_ids"]) for row in rows) == sum(len(s["input_ids"]) for s in samples)
    # 861 tokens in 4 rows of 256, where one sample a row would have been 10.
    assert len(rows) == 4
    for row in rows:
        starts = (row["position_ids"] == 0).nonzero().flatten().tolist()
        # Each sample counts its positions from 0, and its first token is nobody's answer.
        assert starts[0] == 0 and all(row["labels"][start] == IGNORE_INDEX for start in starts)


def random_model(family: str):
    """A two-layer model of `family` with random weights, in training mode (as the trainer runs it)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0)
    if family == "gemma3":
        # A sliding-window layer and a global one, as Gemma 3 alternates them.
        model = Gemma3ForCausalLM(Gemma3TextConfig(**shape, head_dim=8, sliding_window=16,
                                                   layer_types=["sliding_attention", "full_attention"]))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape))
    return model.train()


def forward(model, batch: dict):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != batches.COUNTS})


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_each_sample_of_a_packed_row_sees_only_itself_as_it_would_alone(family):
    model = random_model(family)
    samples = examples([37, 81, 12, 64, 100, 23])
    collate = batches.Collator(pad_token_id=0)
    alone = [forward(model, collate(batches.as_rows([sample]))) for sample in samples]
    rows = batches.pack(samples, 128)
    packed = collate(rows)
    assert "attention_mask" not in packed and len(rows) < len(samples)
    logits = forward(model, packed).logits
    # Find each sample in its row by its tokens, and compare what the model computed for it there.
    for sample, own in zip(samples, alone):
        length = len(sample["input_ids"])
        where = [(row, int(start)) for row in range(len(rows))
                 for start in (rows[row]["position_ids"] == 0).nonzero().flatten()
                 if rows[row]["input_ids"][start:start + length].tolist() == sample["input_ids"]]
        row, start = where[0]
        assert torch.allclose(logits[row, start:start + length], own.logits[0], atol=1e-5)
    # The same losses, packed, padded or one by one (transformers averages over the answer tokens).
    answers = [int((collate(batches.as_rows([s]))["labels"][:, 1:] != IGNORE_INDEX).sum()) for s in samples]
    one_by_one = sum(float(out.loss) * count for out, count in zip(alone, answers))
    padded = collate(batches.as_rows(samples))
    assert float(forward(model, packed).loss) * sum(answers) == pytest.approx(one_by_one, rel=1e-5)
    assert float(forward(model, padded).loss) * sum(answers) == pytest.approx(one_by_one, rel=1e-5)
    # The collator counts real tokens and samples on the CPU, for tokens/s.
    assert packed[batches.COUNTS] == (sum(len(s["input_ids"]) for s in samples), len(samples))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_step_figures_are_written_about_once_a_second_with_every_steps_loss(tmp_path, monkeypatch):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    (tmp_path / "spec.json").write_text(json.dumps({"hyperparameters": {}}))
    job = run.Run(tmp_path)
    writes = []
    monkeypatch.setattr(run, "write_json_atomic",
                        lambda path, value, durable=True: writes.append((value["message"], durable)))
    tape, clock = run.StepTape(), Clock()
    callback = run.metrics_callback(job, 100, tape, clock=clock)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[])
    state, control = TrainerState(max_steps=100), TrainerControl()
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                                                  lambda step: 1.0)
    callback.on_train_begin(args, state, control)
    for step in range(1, 101):
        clock.now += 0.05  # a 50 ms step
        tape.add(torch.tensor(float(step)), tokens=100, samples=2)
        callback.on_optimizer_step(args, state, control, lr_scheduler=scheduler)
        state.global_step = step
        control.should_training_stop = step == 100
        callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 101))
    assert [r["train_loss"] for r in records] == [float(step) for step in range(1, 101)]
    assert all(r["tokens_per_s"] == pytest.approx(2000) and r["samples_per_s"] == pytest.approx(40) and
               r["learning_rate"] == pytest.approx(0.1) for r in records)
    # One durable status at the start; the progress after the first step, then once a second (every 20 steps).
    assert writes[0] == ("Training from step 0", True)
    progress = [message for message, durable in writes[1:] if not durable]
    assert len(writes) == 1 + len(progress) and 5 <= len(progress) <= 7
    assert progress[0] == "Step 1 of 100" and progress[-1] == "Step 100 of 100"


def test_training_arguments_take_the_old_name_of_a_renamed_setting(monkeypatch):
    import transformers

    @dataclasses.dataclass
    class OlderTrainingArguments:  # transformers 5.17's: no activation_checkpointing yet
        output_dir: str = ""
        gradient_checkpointing: bool = False

    monkeypatch.setattr(transformers, "TrainingArguments", OlderTrainingArguments)
    made = run.training_arguments(output_dir="x", activation_checkpointing=True)
    assert made == OlderTrainingArguments(output_dir="x", gradient_checkpointing=True)


def test_the_installed_libraries_are_supported_and_a_cuda_build_label_is_no_problem(monkeypatch):
    assert versions.problems() == []
    real = versions.metadata.version
    monkeypatch.setattr(versions.metadata, "version",
                        lambda name: "2.13.0+cu130" if name == "torch" else real(name))
    assert versions.problems() == []


def test_a_job_on_unsupported_libraries_fails_at_start_with_one_line_naming_what_to_install(tmp_path, monkeypatch):
    real = versions.metadata.version
    monkeypatch.setattr(versions.metadata, "version",
                        lambda name: "4.46.3" if name == "transformers" else real(name))
    (tmp_path / "spec.json").write_text(json.dumps({"kind": "finetune", "method": "lora", "hyperparameters": {}}))

    assert run.main(["run", str(tmp_path)]) == 1

    reason = json.loads((tmp_path / "error.json").read_text())["error"]
    assert "\n" not in reason
    assert "transformers 4.46.3 (needs >=5.17,<6)" in reason
    assert "make install (scripts/install.sh)" in reason and "pip install 'transformers>=5.17,<6'" in reason
    assert reason.count("needs") == 1  # only what is wrong is named


def test_the_job_process_trains_a_small_model_packed_and_logs_every_step(tmp_path):
    data = sample_dataset(tmp_path)
    model = tiny_model(tmp_path / "model", data)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps({
        "kind": "finetune", "method": "lora", "stop_after": "train", "threads": 1, "base_path": str(model),
        "chat_template": CHATML, "dataset_path": str(data), "validation_count": 8,
        "hyperparameters": hyperparameters(max_steps=6, micro_batch_size=4, cutoff=256, save_steps=3,
                                           eval_steps=3)}))
    done = subprocess.run([sys.executable, "-m", "enhancement.training.run", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(r["train_loss"] > 0 and r["tokens_per_s"] > 0 for r in steps)
    # Packed: four rows of up to 256 tokens a step, where four padded samples were about 190.
    assert min(r["tokens_per_s"] * r["step_time_s"] for r in steps) > 700
    assert {r["step"] for r in records if "validation_loss" in r} == {3, 6}
    assert (run_dir / "adapter").is_dir() and json.loads((run_dir / "status.json").read_text())["stage"] == "done"
