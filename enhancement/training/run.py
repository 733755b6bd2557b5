"""A job's process: `python -m enhancement.training.run <run_dir>` reads `<run_dir>/spec.json` and runs the job's
stages, each writing its output whole (to a temporary name, then renamed) before the next starts:

    prune     (prune jobs) pruned/: the base with a share of its weights or MLP channels removed, and
              pruning.json; with recovery steps, the stages below train from it
    train     checkpoints/checkpoint-N every `save_steps`, then adapter/ (LoRA) or trained/ (full); with
              `workers` > 1 on Ray (distributed.py); a distill job trains on its teacher's answers (sequence) or
              against its teacher's logits (distill.py)
    merge     merged/: the base with the adapter folded in, rebuilt from its config as a plain model, with the
              tokenizer and the served chat template
    convert   model-f16.gguf: llama.cpp's converter, with the base GGUF's own vocabulary and the chat template
    quantize  model-<type>.gguf for each requested type: llama.cpp's llama-quantize
    evaluate  report.json: the base and every output on the same held-out text and prompts
    result.json last, naming the outputs: the worker registers models only from it.

It runs in its own session (process group): the worker watches it, ingests `metrics.jsonl`, and kills the group on
cancel; a worker restart leaves it running. Run again (a redelivered job), it continues after the last finished
stage and, in training, from the newest complete checkpoint; an exclusive lock on `<run_dir>/lock` makes a second
process for the same job exit at once, so a job never trains twice. No Django here: this runs on any node, and
inside Ray workers.

Before it imports torch, transformers or peft it checks their versions (versions.py) and refuses unsupported ones
in one line. A training step does the model's work and little else, so that a GPU is not left waiting for the host:
the batches are built once (batches.py: short samples packed into rows of `cutoff` tokens), nothing in a step
copies from the device or waits for a disk, and the steps' figures are written together about once a second
(metrics_callback). bench/step_overhead measures what is left.
"""

import dataclasses
import errno
import fcntl
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from accounts.atomic_files import write_json_atomic
from cluster import cpu_budget
from enhancement.training import LOGGERS_QUIET_ON_CPU, batches, data
from enhancement.training.bases import base_location, load_base

LOCKED_EXIT = 75
# A step's own bookkeeping stays off the step (bench/step_overhead measures what is left): the figures of the steps
# since the last write go to metrics.jsonl, and the progress to status.json and the log, together about once a
# second, and at once before a checkpoint or an evaluation and at the last step.
PROGRESS_EVERY_S = 1.0


class NoTrainingData(ValueError):
    pass


# The pool's signal (cluster/scheduling/): the job's worker writes this file; every rank sees it at a step's end
# (a file crosses nodes, as the run directory must), saves a checkpoint and stops.
STOP_FILE = "stop"
# Written once the process has stopped at a checkpoint for the pool: the worker requeues the job, not fails it.
STOPPED_FILE = "stopped.json"


class StoppedAtCheckpoint(Exception):
    """Training saved a checkpoint and stopped because the pool asked; a rerun resumes from it."""


def stop_requested(run_dir: Path) -> bool:
    return (run_dir / STOP_FILE).exists()


def stop_callback(run_dir: Path):
    """At each step's end, the pool's request to stop: saved as a checkpoint, then training stops. In a
    distributed run the ranks agree (one collective a step), so none waits on the others' next step."""
    from transformers import TrainerCallback

    class StopAtCheckpoint(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            requested = stop_requested(run_dir)
            if args.world_size > 1:
                import torch
                import torch.distributed as dist

                flag = torch.tensor([int(requested)])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                requested = bool(flag.item())
            if requested:
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopAtCheckpoint()


class Run:
    """A job's run directory and spec. Only the writer (the process itself, or rank 0 of a distributed run) writes
    status and metrics."""

    def __init__(self, run_dir: Path, *, writer: bool = True):
        self.dir = run_dir
        self.spec = json.loads((run_dir / "spec.json").read_text())
        self.hyper = self.spec.get("hyperparameters", {})
        self.writer = writer
        self.metrics = (run_dir / "metrics.jsonl").open("a", encoding="utf-8") if writer else None

    def status(self, stage: str, message: str = "", *, durable: bool = True, **fields) -> None:
        if not self.writer:
            return
        write_json_atomic(self.dir / "status.json", {"stage": stage, "message": message, "at": time.time(),
                                                     **fields}, durable=durable)
        print(f"[{stage}] {message}", flush=True)

    def metric(self, *records: dict) -> None:
        if not self.writer or not records:
            return
        self.metrics.write("".join(json.dumps(record) + "\n" for record in records))
        self.metrics.flush()


def latest_complete_checkpoint(checkpoints: Path) -> Path | None:
    """The newest checkpoint whose trainer state was written (the Trainer writes it last); incomplete ones (a kill
    or a full disk mid-save) are removed so that nothing resumes from them."""
    found = []
    for candidate in checkpoints.glob("checkpoint-*"):
        try:
            step = int(candidate.name.rsplit("-", 1)[1])
            json.loads((candidate / "trainer_state.json").read_text())
        except (ValueError, OSError):
            shutil.rmtree(candidate, ignore_errors=True)
            continue
        found.append((step, candidate))
    return max(found)[1] if found else None


def training_examples(run: Run, tokenizer) -> tuple[list[dict], list[dict]]:
    conversations = data.read_conversations(Path(run.spec["dataset_path"]))
    train, validation = data.split(conversations, run.spec.get("validation_count", 0))
    cutoff = run.hyper["cutoff"]
    template = run.spec.get("chat_template", "")

    def encoded(items):
        out = []
        for messages in items:
            example = data.encode(tokenizer, messages, template, cutoff)
            if any(label != data.IGNORE_INDEX for label in example["labels"]):
                out.append({"input_ids": example["input_ids"], "labels": example["labels"]})
        return out

    return encoded(train), encoded(validation)


class StepTape:
    """What each step leaves for the metrics without making the device wait: its micro-batches' losses as tensors
    where they were computed (read later, many steps in one copy) and their non-padding tokens and samples, counted
    by the collator on the CPU."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.losses, self.tokens, self.samples = [], 0, 0

    def add(self, loss, tokens: int, samples: int) -> None:
        self.losses.append(loss)
        self.tokens += tokens
        self.samples += samples

    def take(self) -> tuple:
        """The step's loss (a tensor, or None), tokens and samples; the tape starts the next step empty."""
        loss = sum(self.losses[1:], self.losses[0]) if self.losses else None
        taken = (loss, self.tokens, self.samples)
        self.reset()
        return taken


def step_trainer(trainer_class, tape: StepTape):
    """`trainer_class` with a step that records its loss and counts on `tape`. transformers' own per-step figures
    each made the device wait for the host (the NaN check of every loss, the token count's `.item()`, the logged
    loss), and it counted the model's parameters again for every batch's FLOPs."""

    class StepTrainer(trainer_class):
        _flops_per_token = None

        def training_step(self, model, inputs, num_items_in_batch=None):
            tokens, samples = inputs.pop(batches.COUNTS, (0, 0))
            loss = super().training_step(model, inputs, num_items_in_batch)
            tape.add(loss, tokens, samples)
            return loss

        def prediction_step(self, model, inputs, *args, **kwargs):
            inputs.pop(batches.COUNTS, None)
            return super().prediction_step(model, inputs, *args, **kwargs)

        def floating_point_ops(self, inputs) -> int:
            if self._flops_per_token is None:
                count = getattr(self.model, "num_parameters", None)
                self._flops_per_token = 6 * count(exclude_embeddings=True) if count else 0
            return self._flops_per_token * inputs["input_ids"].numel()

    return StepTrainer


class GpuBusy:
    """The device's busy share, read by a thread of its own every `interval_s`: torch.cuda.utilization() opens NVML
    anew on every call (pynvml.nvmlInit), a cost no training step should carry."""

    def __init__(self, interval_s: float = PROGRESS_EVERY_S):
        self.interval_s = interval_s
        self.percent: float | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        import torch

        if torch.cuda.is_available():
            threading.Thread(target=self._read, name="gpu-busy", daemon=True).start()

    def _read(self) -> None:
        import torch

        while not self._stop.is_set():
            try:
                self.percent = float(torch.cuda.utilization())
            except Exception:  # utilization needs NVML, which not every node has
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


def metrics_callback(run: Run, total_steps_hint: int, tape: StepTape, *, losses_on_tape: bool = True,
                     every_s: float = PROGRESS_EVERY_S, clock=time.monotonic):
    """Each step as one JSON line (loss, learning rate, speed, ETA, the process's CPU and memory, the device's),
    written with the steps before it about every `every_s`. With `losses_on_tape` False (a data-parallel run, whose
    loss transformers averages over the workers) the loss comes from transformers' own log of every step."""
    import psutil
    import torch
    from transformers import TrainerCallback

    process = psutil.Process()
    process.cpu_percent()
    gpu = GpuBusy(every_s)

    class Metrics(TrainerCallback):
        def __init__(self):
            self.last_time = clock()
            self.last_write: float | None = None
            self.pending: list[dict] = []
            self.recent: list[float] = []
            self.learning_rate: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.last_time = clock()
            tape.reset()
            run.status("train", f"Training from step {state.global_step}", step=state.global_step,
                       total_steps=state.max_steps or total_steps_hint)
            gpu.start()

        def on_optimizer_step(self, args, state, control, **kwargs):
            # The rate this step used: the schedule moves on after this call.
            scheduler = kwargs.get("lr_scheduler")
            if scheduler is not None:
                rate = scheduler.get_last_lr()[0]
                self.learning_rate = float(rate.item() if hasattr(rate, "item") else rate)

        def on_step_end(self, args, state, control, **kwargs):
            now = clock()
            elapsed, self.last_time = now - self.last_time, now
            loss, tokens, samples = tape.take()
            self.pending.append({"step": state.global_step, "at": time.time(), "elapsed": elapsed,
                                 "tokens": tokens, "samples": samples, "learning_rate": self.learning_rate,
                                 "loss": loss if losses_on_tape else None})
            self.recent = (self.recent + [elapsed])[-10:]
            if (self.last_write is None or now - self.last_write >= every_s or control.should_save
                    or control.should_evaluate or control.should_training_stop
                    or state.global_step >= state.max_steps):
                self.write(args, state)

        def write(self, args, state):
            self.last_write = clock()
            if not self.pending:
                return
            losses = [entry["loss"] for entry in self.pending if entry["loss"] is not None]
            values = iter(torch.stack([loss.float() for loss in losses]).cpu().tolist() if losses else [])
            figures = {"cpu_percent": process.cpu_percent(), "memory_bytes": process.memory_info().rss}
            if torch.cuda.is_available():
                figures["gpu_memory_bytes"] = torch.cuda.max_memory_allocated()
                if gpu.percent is not None:
                    figures["gpu_percent"] = gpu.percent
            pace = sum(self.recent) / len(self.recent)
            records = []
            for entry in self.pending:
                elapsed = entry["elapsed"]
                # A data-parallel step is every worker's batch; this one counted its own.
                record = {"type": "step", "step": entry["step"], "at": entry["at"], "step_time_s": elapsed,
                          "tokens_per_s": entry["tokens"] * args.world_size / elapsed if elapsed > 0 else None,
                          "samples_per_s": entry["samples"] * args.world_size / elapsed if elapsed > 0 else None,
                          "eta_s": max(0, state.max_steps - entry["step"]) * pace, **figures}
                if entry["loss"] is not None:
                    record["train_loss"] = next(values)
                if entry["learning_rate"] is not None:
                    record["learning_rate"] = entry["learning_rate"]
                records.append(record)
            self.pending = []
            run.metric(*records)
            run.status("train", f"Step {state.global_step} of {state.max_steps}", durable=False,
                       step=state.global_step, total_steps=state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            record = {"type": "log", "step": state.global_step, "at": time.time()}
            if "loss" in logs and not losses_on_tape:
                record["train_loss"] = logs["loss"]
            if "eval_loss" in logs:
                record["validation_loss"] = logs["eval_loss"]
            if len(record) > 3:
                run.metric(record)

        def on_train_end(self, args, state, control, **kwargs):
            self.write(args, state)
            gpu.stop()

    return Metrics()


def training_arguments(**settings):
    """TrainingArguments across the transformers versions the runner supports (versions.py): a setting renamed
    between them goes by the name the installed one has."""
    from transformers import TrainingArguments

    known = {field.name for field in dataclasses.fields(TrainingArguments)}
    if "activation_checkpointing" in settings and "activation_checkpointing" not in known:
        settings["gradient_checkpointing"] = settings.pop("activation_checkpointing")
    return TrainingArguments(**settings)


def final_dir(run: Run) -> Path:
    return run.dir / ("adapter" if run.spec["method"] == "lora" else "trained")


def train(run: Run) -> None:
    """The training stage, from the newest complete checkpoint if there is one: in this process, or with
    `workers` > 1 as data-parallel workers on Ray (enhancement/training/distributed.py)."""
    if final_dir(run).exists():
        return
    checkpoints = run.dir / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    resume = latest_complete_checkpoint(checkpoints)
    if resume is not None:
        run.status("train", f"Resuming from {resume.name}")
    if int(run.hyper.get("workers", 1)) > 1:
        from enhancement.training import distributed

        distributed.train_on_ray(run, resume, ray_worker)
    else:
        fit(run, resume)
    if stop_requested(run.dir) and not final_dir(run).exists():
        checkpoint = latest_complete_checkpoint(checkpoints)
        raise StoppedAtCheckpoint(f"Stopped at {checkpoint.name if checkpoint else 'the start'} for the pool")


def ray_worker(config: dict) -> None:
    """One data-parallel worker of a run on Ray (distributed.train_on_ray); rank 0 writes."""
    from enhancement.training import distributed

    rank, place = distributed.rank_and_place()
    print(place, flush=True)
    run = Run(Path(config["run_dir"]), writer=rank == 0)
    if config["threads"]:
        import torch

        torch.set_num_threads(config["threads"])
    fit(run, Path(config["resume"]) if config["resume"] else None)


def fit(run: Run, resume: Path | None) -> None:
    """Train with the HF Trainer; in a distributed run every worker runs this, and rank 0 writes the checkpoints,
    the metrics and the result."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer

    hyper = run.hyper
    tokenizer = data.load_tokenizer(str(base_location(run.spec)))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    run.status("train", "Tokenizing the dataset")
    train_set, validation_set = training_examples(run, tokenizer)
    if not train_set:
        raise NoTrainingData("No training sample has an answer within the cutoff; raise the cutoff.")
    if hyper.get("packing", True):
        train_set, validation_set = (batches.pack(rows, hyper["cutoff"]) for rows in (train_set, validation_set))
    else:
        train_set, validation_set = batches.as_rows(train_set), batches.as_rows(validation_set)
    model = load_base(run.spec)
    if run.spec["method"] == "lora":
        model = get_peft_model(model, LoraConfig(
            r=hyper["lora_rank"], lora_alpha=hyper["lora_alpha"], lora_dropout=hyper["lora_dropout"],
            target_modules=hyper["lora_targets"], task_type="CAUSAL_LM"))
    if hyper.get("recompute"):
        model.enable_input_require_grads()
    cuda = torch.cuda.is_available()
    workers = int(hyper.get("workers", 1))
    # One process reads its losses off the tape (StepTape); a data-parallel run logs every step through
    # transformers, whose logged loss is the mean over the workers.
    on_tape = workers == 1
    args = training_arguments(
        output_dir=str(run.dir / "checkpoints"), max_steps=hyper.get("max_steps") or -1,
        num_train_epochs=hyper.get("epochs") or 1, learning_rate=hyper["learning_rate"],
        lr_scheduler_type=hyper["lr_scheduler"], warmup_steps=hyper.get("warmup_steps", 0),
        per_device_train_batch_size=hyper["micro_batch_size"], per_device_eval_batch_size=hyper["micro_batch_size"],
        gradient_accumulation_steps=hyper["gradient_accumulation"],
        activation_checkpointing=bool(hyper.get("recompute")),
        logging_strategy="no" if on_tape else "steps", logging_steps=1, logging_nan_inf_filter=False,
        save_strategy="steps", save_steps=hyper["save_steps"], save_total_limit=2,
        eval_strategy="steps" if validation_set else "no", eval_steps=hyper["eval_steps"],
        seed=hyper["seed"], data_seed=hyper["seed"], report_to=[], disable_tqdm=True, use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(), dataloader_num_workers=0, remove_unused_columns=False,
        # Batches are collated in microseconds (batches.py); on a GPU they go over from pinned memory without
        # waiting, while the device still runs the step before.
        dataloader_pin_memory=cuda, accelerator_config={"non_blocking": cuda},
        include_num_input_tokens_seen="no", save_only_model=False,
        ddp_backend=("nccl" if cuda else "gloo") if workers > 1 else None)
    steps_hint = hyper.get("max_steps") or math.ceil(
        len(train_set) / (hyper["micro_batch_size"] * hyper["gradient_accumulation"] * workers)) * (
        hyper.get("epochs") or 1)
    tape = StepTape()
    trainer_class = step_trainer(Trainer, tape)
    if run.spec.get("teacher_path"):
        from enhancement.training.distill import distilling_trainer

        run.status("train", "Loading the teacher for logit distillation")
        trainer_class = distilling_trainer(trainer_class, load_base(run.spec, key="teacher_path"),
                                           temperature=run.spec["kd"]["temperature"], alpha=run.spec["kd"]["alpha"])
    callbacks = [metrics_callback(run, steps_hint, tape, losses_on_tape=on_tape)] if run.writer else []
    callbacks.append(stop_callback(run.dir))
    trainer = trainer_class(model=model, args=args, train_dataset=train_set, eval_dataset=validation_set or None,
                            data_collator=batches.Collator(tokenizer.pad_token_id), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if not trainer.is_world_process_zero() or stop_requested(run.dir):
        return
    final = final_dir(run)
    partial = run.dir / f".{final.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    trainer.model.save_pretrained(str(partial))
    os.replace(partial, final)


def save_plain(run: Run, model, target: Path) -> None:
    """`model` as a plain Hugging Face directory with the tokenizer and the served chat template, written whole."""
    tokenizer = data.load_tokenizer(str(base_location(run.spec)))
    if run.spec.get("chat_template"):
        tokenizer.chat_template = run.spec["chat_template"]
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    os.replace(partial, target)


def merge(run: Run) -> None:
    """The trained weights as a plain Hugging Face model, with the tokenizer and the served chat template."""
    import torch
    from transformers import AutoModelForCausalLM

    target = run.dir / "merged"
    if target.exists():
        return
    run.status("merge", "Folding the adapter into the base model")
    if run.spec["method"] == "lora":
        from peft import PeftModel

        model = PeftModel.from_pretrained(load_base(run.spec, torch.float32), str(run.dir / "adapter"))
        plain = model.merge_and_unload()
    else:
        plain = AutoModelForCausalLM.from_pretrained(str(run.dir / "trained"), dtype=torch.float32)
    save_plain(run, plain, target)


def prune(run: Run) -> Path:
    """The base with the requested share pruned (enhancement/training/pruning.py), as a plain Hugging Face model;
    what was pruned goes to pruning.json for the report."""
    import torch

    from enhancement.training import pruning

    target = run.dir / "pruned"
    if target.exists():
        return target
    settings = run.spec["compression"]
    run.status("prune", f"Pruning {settings['sparsity']:.0%} of the weights ({settings['method']})")
    model = load_base(run.spec, torch.float32)
    summary = pruning.prune_model(model, settings["method"], settings["sparsity"])
    write_json_atomic(run.dir / "pruning.json", summary)
    save_plain(run, model, target)
    return target


def trained_source(run: Run, stop_after: str) -> Path | None:
    """The Hugging Face directory to export: fine-tuned (or distilled) and merged, or pruned and, with recovery
    steps, fine-tuned from there. None when the run stops after training."""
    kind = run.spec["kind"]
    if kind == "prune":
        pruned = prune(run)
        if not run.hyper.get("max_steps"):
            return pruned
        run.spec["base_path"] = str(pruned)  # the recovery fine-tune starts from the pruned model
    train(run)
    if stop_after == "train":
        return None
    merge(run)
    return run.dir / "merged"


def main(argv: list[str]) -> int:
    from enhancement.training import versions

    run_dir = Path(argv[1])
    lock = (run_dir / "lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("Another process is already running this job; this one stops.", flush=True)
        return LOCKED_EXIT
    run = Run(run_dir)
    (run_dir / "error.json").unlink(missing_ok=True)
    # Training is background work: engines serving chats on this node come first (cluster/cpu_budget.py).
    cpu_budget.yield_to_interactive()
    # Before torch, transformers or peft are imported: a node with other versions learns it in one line.
    try:
        versions.check()
    except versions.UnsupportedVersions as exc:
        return failed(run, str(exc))
    from enhancement.training import distributed, evaluate, export, pruning

    for name in LOGGERS_QUIET_ON_CPU:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        if run.spec.get("threads"):
            import torch

            torch.set_num_threads(int(run.spec["threads"]))
        # Benchmarks stop after the stage they measure: "train", or "export" (they evaluate on their own terms).
        stop_after = run.spec.get("stop_after", "")
        if run.spec["kind"] == "quantize":
            source = Path(run.spec["base_path"])
        else:
            source = trained_source(run, stop_after)
            if source is None:
                run.status("done", "Trained")
                return 0
        outputs = export.export(run, source)
        if stop_after == "export":
            write_json_atomic(run.dir / "exported.json", outputs)
            run.status("done", "Exported")
            return 0
        report = evaluate.evaluate(run, outputs)
        if (run.dir / "pruning.json").exists():
            report = {**report, "pruning": json.loads((run.dir / "pruning.json").read_text())}
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            return failed(run, f"The disk filled up: {exc}. Free space and run the job again; it resumes from "
                               f"its last complete checkpoint.")
        raise
    except (export.ExportFailed, data.TemplateMismatch, NoTrainingData, distributed.RayMissing,
            pruning.PruneRefused) as exc:
        return failed(run, str(exc))
    except StoppedAtCheckpoint as exc:
        write_json_atomic(run.dir / STOPPED_FILE, {"reason": str(exc)})
        run.status("train", str(exc))
        return 0
    write_json_atomic(run.dir / "result.json", {"outputs": outputs, "report": report})
    run.status("done", "Finished")
    return 0


def failed(run: Run, reason: str) -> int:
    """The reason the worker shows the user; anything unexpected goes to the log with its traceback."""
    write_json_atomic(run.dir / "error.json", {"error": reason})
    print(reason, file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    # Run as the importable module, so that what Ray sends its workers (ray_worker) is named by its module rather
    # than pickled whole out of __main__.
    from enhancement.training import run as importable

    sys.exit(importable.main(sys.argv))
