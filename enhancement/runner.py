"""The worker's side of a job: it starts the job's process (enhancement/training/run.py) in a session of its own,
watches it, copies its metrics into the database, kills its process group when the job is cancelled, and registers
its outputs once the process has written them all.

On disk, under `$FACTORY_DATA_DIR/enhancement/jobs/<id>-<created>/`: spec.json (what to do), train.log, metrics.jsonl,
status.json, checkpoints/, the stage outputs, result.json (written last), error.json (a failure's reason); for
sequence-level distillation teacher.jsonl (the teacher's answers, written here before the process starts), for
pruning pruning.json (what was pruned).

A worker that dies leaves the process running (its own session). The redelivered job finds it by its pid and start
time and watches it again; if it died too, a new process continues from the last finished stage and checkpoint.
Either way the job trains once, and models are registered only from a complete result.json.
"""

import json
import logging
import os
import shutil
import sys
import time
from datetime import datetime, timezone as dt_timezone
from pathlib import Path

from django.conf import settings
from django.db import transaction

from accounts.atomic_files import write_json_atomic
from accounts.errors import ApplicationError
from accounts.services import service_token
from cluster.models import Job, JobState
from cluster.scheduling import pool
from enhancement import files, log_messages as log
from enhancement.formats import parse_jsonl
from enhancement.models import DistillMode, EnhancementJob, JobKind, MetricSample, Stage
from enhancement.training import data
from enhancement.training.run import STOP_FILE, STOPPED_FILE
from serving.engines import process
from serving.models import Model, ModelKind
from serving.services import register_produced_model

logger = logging.getLogger(__name__)
POLL_S = 1.0
# The name this app registers its output directory under with serving (see apps.py).
PRODUCER = "enhancement"
TEACHER_DATA = "teacher.jsonl"
METRIC_FIELDS = ("train_loss", "validation_loss", "learning_rate", "tokens_per_s", "samples_per_s", "step_time_s",
                 "eta_s", "cpu_percent", "memory_bytes", "gpu_percent", "gpu_memory_bytes")


class JobFailed(RuntimeError):
    pass


def run_dir(job: EnhancementJob) -> Path:
    return files.run_dir(job.pk, job.created_at)


def build_spec(job: EnhancementJob, directory: Path) -> dict:
    """What the job's process needs, as plain paths and numbers (it runs without Django)."""
    base = job.base_model
    if job.dataset_sha256:
        eval_path, eval_validation = files.dataset_path(job.dataset_sha256), job.dataset.validation_count
    else:
        # A compression job without a dataset is measured on the shipped sample's conversations.
        _, conversations = parse_jsonl(files.SAMPLE_DATASET.read_bytes())
        eval_path, eval_validation = directory / "eval.jsonl", 0
        eval_path.write_text("".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n"
                                     for c in conversations[-16:]), encoding="utf-8")
    is_gguf = base.kind == ModelKind.GGUF
    spec = {
        "job": job.pk, "kind": job.kind, "method": job.method, "hyperparameters": job.hyperparameters,
        "base_path": base.path, "base_gguf": base.path if is_gguf else "",
        "converted_bases_dir": str(files.converted_bases_dir()),
        "base_quantization": base.quantization if is_gguf else "", "chat_template": base.chat_template,
        "tokenizer_path": base.path, "quantizations": job.quantizations, "compression": job.compression,
        "dataset_path": str(files.dataset_path(job.dataset_sha256)) if job.dataset_sha256 else "",
        "validation_count": job.dataset.validation_count if job.dataset_sha256 else 0,
        "eval_dataset_path": str(eval_path), "eval_validation_count": eval_validation,
        # The nodes a plan spans: more than one means a Ray cluster across them (training/distributed.py).
        "plan_nodes": job.plan.get("nodes", []) if job.plan.get("chosen", {}).get("nodes", 1) > 1 else [],
    }
    if job.kind == JobKind.DISTILL and job.compression["mode"] == DistillMode.SEQUENCE:
        spec["dataset_path"] = str(directory / TEACHER_DATA)
    elif job.kind == JobKind.DISTILL:
        spec["teacher_path"] = job.compression["path"]
        spec["kd"] = {"temperature": job.compression["temperature"], "alpha": job.compression["alpha"]}
    return spec


def teacher_answers(job: EnhancementJob, directory: Path, report) -> bool:
    """Sequence-level distillation's data: the teacher deployment's answer to each training prompt (a dataset
    conversation up to its last answer), asked through the gateway as the job's workspace; the validation split
    keeps the dataset's own answers, so the report measures against the data. Answers are appended as they come,
    so a job that runs again asks only for the rest. False when the job was cancelled meanwhile."""
    target = directory / TEACHER_DATA
    if target.exists():
        return True
    from openai import OpenAI, OpenAIError

    conversations = data.read_conversations(files.dataset_path(job.dataset_sha256))
    train, validation = data.split(conversations, job.dataset.validation_count)
    prompts = [messages[:-1] for messages in train if messages[-1]["role"] == "assistant"]
    prompts = prompts[:job.compression["max_prompts"]]
    partial = directory / f"{TEACHER_DATA}.partial"
    done = partial.read_bytes() if partial.exists() else b""
    done = done[:done.rfind(b"\n") + 1]  # a line cut by a kill is asked again
    partial.write_bytes(done)
    answered = done.count(b"\n")
    teacher = job.compression["deployment"]
    client = OpenAI(base_url=settings.GATEWAY_URL, api_key=service_token(workspace_id=job.workspace_id),
                    timeout=600, max_retries=2)
    EnhancementJob.objects.filter(pk=job.pk).update(stage=Stage.TEACH, step=answered, total_steps=len(prompts))
    with partial.open("a", encoding="utf-8") as out:
        for index in range(answered, len(prompts)):
            if cancelled(job):
                return False
            try:
                reply = client.chat.completions.create(model=teacher, messages=prompts[index], temperature=0,
                                                       max_tokens=job.hyperparameters["cutoff"])
            except OpenAIError as exc:
                raise JobFailed(f"The teacher deployment '{teacher}' did not answer prompt {index + 1}: {exc}")
            answer = (reply.choices[0].message.content or "").strip()
            line = {"messages": prompts[index] + [{"role": "assistant", "content": answer}]} if answer else {}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            out.flush()
            EnhancementJob.objects.filter(pk=job.pk).update(step=index + 1)
            report(0.2 * (index + 1) / len(prompts), "")
    taught = [json.loads(line) for line in partial.read_text(encoding="utf-8").splitlines()]
    taught = [line for line in taught if line]
    if not taught:
        raise JobFailed(f"The teacher deployment '{teacher}' gave no answer to any of the {len(prompts)} prompts.")
    write_json_lines_atomic(target, taught + [{"messages": messages} for messages in validation])
    partial.unlink()
    EnhancementJob.objects.filter(pk=job.pk).update(step=0, total_steps=0)
    return True


def write_json_lines_atomic(path: Path, rows: list[dict]) -> None:
    partial = path.with_name(f".{path.name}.writing")
    partial.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    os.replace(partial, path)


def log_tail(job: EnhancementJob, lines: int = 40) -> str:
    return process.log_tail(run_dir(job) / "train.log", lines)


def read_status(job: EnhancementJob) -> dict:
    try:
        return json.loads((run_dir(job) / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _start_time(pid: int) -> float | None:
    """The process's start time in clock ticks since boot: with the pid, it tells our process from a later one
    that reused the number."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return float(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_running(job: EnhancementJob) -> bool:
    return bool(job.pid) and process.is_alive(job.pid) and _start_time(job.pid) == job.pid_started_at


def _launch(job: EnhancementJob, directory: Path) -> None:
    argv = [sys.executable, "-m", "enhancement.training.run", str(directory)]
    env = {"PYTHONPATH": str(settings.BASE_DIR), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    pid = process.launch(argv, log_path=directory / "train.log", env=env)
    job.pid, job.pid_started_at = pid, _start_time(pid)
    EnhancementJob.objects.filter(pk=job.pk).update(pid=job.pid, pid_started_at=job.pid_started_at)


class MetricsReader:
    """Follows metrics.jsonl; each step's figures are merged into its one MetricSample row."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def ingest(self, job: EnhancementJob) -> None:
        try:
            with self.path.open("rb") as source:
                source.seek(self.offset)
                chunk = source.read()
        except FileNotFoundError:
            return
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            figures = {name: record[name] for name in METRIC_FIELDS if record.get(name) is not None}
            if not figures:
                continue
            at = datetime.fromtimestamp(record.get("at", time.time()), tz=dt_timezone.utc)
            sample, created = MetricSample.objects.get_or_create(job=job, step=record["step"],
                                                                 defaults={"at": at, **figures})
            if not created:
                MetricSample.objects.filter(pk=sample.pk).update(at=at, **figures)


def cancelled(job: EnhancementJob) -> bool:
    """Cancelled, or gone: a job whose workspace was deleted has no rows left to say so, and its process must not
    train on for nobody."""
    return not Job.objects.filter(pk=job.cluster_job_id).exclude(state=JobState.CANCELLED).exists()


def fit_to_devices(directory: Path, devices: int) -> None:
    """An elastic job restarts on the devices the pool gave it: that many data-parallel workers, with gradient
    accumulation making up the same global batch, so its loss curve does not depend on the resizes."""
    spec = json.loads((directory / "spec.json").read_text())
    hyper = spec["hyperparameters"]
    # Elastic: it has a min_workers (the spec's workers is its size now, its minimum after a shrink).
    if not int(hyper.get("min_workers") or 0) or hyper["workers"] == devices:
        return
    hyper["workers"] = devices
    hyper["gradient_accumulation"] = hyper["batch_size"] // (devices * hyper["micro_batch_size"])
    write_json_atomic(directory / "spec.json", spec)


def last_checkpoint_at(directory: Path) -> float | None:
    """When the newest complete checkpoint was finished (its trainer state is written last). Only read: the
    process may be writing the next one now."""
    times = []
    for state in (directory / "checkpoints").glob("checkpoint-*/trainer_state.json"):
        try:
            times.append(state.stat().st_mtime)
        except FileNotFoundError:
            continue  # rotated away meanwhile (the trainer keeps the newest two)
    return max(times, default=None)


def _follow_the_pool(job: EnhancementJob, directory: Path, seen_checkpoint: list) -> None:
    """Tell the process what the pool asks (checkpoint and stop; past the grace period, stop now), and tell the
    pool when the job last checkpointed (its victims are chosen by the progress they would lose)."""
    checkpointed = last_checkpoint_at(directory)
    if checkpointed is not None and checkpointed != seen_checkpoint[0]:
        seen_checkpoint[0] = checkpointed
        pool.record_checkpoint(job.cluster_job_id, datetime.fromtimestamp(checkpointed, tz=dt_timezone.utc))
    instruction = pool.stop_instruction(job.cluster_job_id)
    if instruction and not (directory / STOP_FILE).exists():
        (directory / STOP_FILE).touch()
    if instruction == "kill":
        process.terminate(job.pid)


def supervise(job: EnhancementJob, report) -> dict:
    directory = run_dir(job)
    if (directory / "result.json").exists():
        return finish(job)
    if not is_running(job):
        (directory / STOP_FILE).unlink(missing_ok=True)
        (directory / STOPPED_FILE).unlink(missing_ok=True)
        directory.mkdir(parents=True, exist_ok=True)
        if job.kind == JobKind.DISTILL and job.compression["mode"] == DistillMode.SEQUENCE and \
                not teacher_answers(job, directory, report):
            return {"cancelled": True}
        if not (directory / "spec.json").exists():
            write_json_atomic(directory / "spec.json", build_spec(job, directory))
        elif (directory / "lock").exists():
            report(0.0, log.CONTINUING())
        fit_to_devices(directory, pool.devices_for(job.cluster_job_id))
        _launch(job, directory)
        # Until the process writes its first status it is loading (or converting) the base, not queued.
        EnhancementJob.objects.filter(pk=job.pk, stage=Stage.QUEUED).update(stage=Stage.PREPARE)
    reader = MetricsReader(directory / "metrics.jsonl")
    seen_checkpoint: list = [None]
    while True:
        reader.ingest(job)
        _follow_the_pool(job, directory, seen_checkpoint)
        status = read_status(job)
        if status:
            stage = status.get("stage", job.stage)
            total, step = status.get("total_steps") or job.total_steps, status.get("step") or job.step
            EnhancementJob.objects.filter(pk=job.pk).update(stage=stage if stage in Stage.values else job.stage,
                                                            step=step, total_steps=total)
            job.stage, job.step, job.total_steps = stage, step, total
            report(_progress(job), "")
        if cancelled(job):
            process.terminate(job.pid)
            return {"cancelled": True}
        if not is_running(job):
            break
        time.sleep(POLL_S)
    reader.ingest(job)
    if (directory / "result.json").exists():
        return finish(job)
    if (directory / STOPPED_FILE).exists() or pool.stop_instruction(job.cluster_job_id) == "kill":
        raise pool.Preempted(f"Job {job.pk} stopped at a checkpoint for the pool")
    try:
        reason = json.loads((directory / "error.json").read_text())["error"]
    except (OSError, ValueError, KeyError):
        reason = log.STOPPED_WITHOUT_FINISHING(log=log_tail(job, 12))
    EnhancementJob.objects.filter(pk=job.pk).update(error=reason)
    raise JobFailed(reason)


def _progress(job: EnhancementJob) -> float:
    if job.stage == Stage.TRAIN and job.total_steps:
        return 0.8 * job.step / job.total_steps
    return {Stage.PRUNE: 0.1, Stage.MERGE: 0.82, Stage.CONVERT: 0.85, Stage.QUANTIZE: 0.9,
            Stage.EVALUATE: 0.95}.get(job.stage, 0.0)


def finish(job: EnhancementJob) -> dict:
    """Register each output as a model (once: a repeated finish finds them), then mark the job done. Whatever
    stops it is recorded on the job with its reason."""
    try:
        return _register_outputs(job)
    except Exception as exc:
        reason = f"The job's outputs were made but could not be registered: {failure_reason(exc)}"
        EnhancementJob.objects.filter(pk=job.pk).update(error=reason)
        raise JobFailed(reason) from exc


def failure_reason(exc: BaseException) -> str:
    """The words to show for a failure: an application error's message, or the exception's own text and kind."""
    if isinstance(exc, ApplicationError):
        return exc.message
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def record_failure(job: EnhancementJob, exc: BaseException) -> str:
    """Keep the reason a stage already recorded; otherwise record this one. The job's error is never empty."""
    reason = str(exc) if isinstance(exc, JobFailed) else failure_reason(exc)
    EnhancementJob.objects.filter(pk=job.pk, error="").update(error=reason or "The job failed.")
    return reason


def _register_outputs(job: EnhancementJob) -> dict:
    result = json.loads((run_dir(job) / "result.json").read_text())
    job = EnhancementJob.objects.select_related("base_model", "workspace", "created_by").get(pk=job.pk)
    EnhancementJob.objects.filter(pk=job.pk).update(stage=Stage.REGISTER)
    names = []
    with transaction.atomic():
        for output in result["outputs"]:
            name = f"{job.name}-{output['quantization']}".replace("_", "-")
            model = Model.objects.filter(workspace=job.workspace, name=name, path=output["path"]).first()
            if model is None:
                # The chat template travels inside the GGUF, so the registry reads it from the file.
                model = register_produced_model(
                    producer=PRODUCER, workspace=job.workspace, name=name, path=output["path"],
                    requested_by=job.created_by, role_hint=job.base_model.role_hint,
                    detail={"job": job.pk, "job_name": job.name, "base_model": job.base_model.name})
            job.output_models.add(model)
            names.append(model.name)
        EnhancementJob.objects.filter(pk=job.pk).update(report=result["report"], stage=Stage.DONE, error="")
    if not job.keep_intermediates:
        remove_intermediates(job, keep=[Path(output["path"]) for output in result["outputs"]])
    return {"models": names}


# What stays in a finished job's directory besides its outputs: the small records (spec, status, metrics, report,
# log, pruning summary, teacher answers) that its page and a rerun read.
RECORD_SUFFIXES = (".json", ".jsonl", ".log")


def disk_bytes(path: Path) -> int:
    """The bytes under `path` (a file, or a directory's files together); 0 when it is gone."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def remove_intermediates(job: EnhancementJob, *, keep: list[Path]) -> int:
    """Remove what the job made on the way to its outputs (checkpoints, adapter, merged or pruned weights, an f16
    GGUF nobody asked for); returns the bytes freed."""
    kept = {path.resolve() for path in keep}
    freed = 0
    for entry in run_dir(job).iterdir():
        if entry.resolve() in kept or (entry.is_file() and entry.suffix in RECORD_SUFFIXES) or entry.name == "lock":
            continue
        freed += disk_bytes(entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return freed


def remove_run_dir(directory: Path) -> int:
    """Remove a job's run directory (only ever one under the jobs root); returns the bytes freed."""
    root = files.jobs_root().resolve()
    if not directory.resolve().is_relative_to(root) or directory.resolve() == root or not directory.exists():
        return 0
    freed = disk_bytes(directory)
    shutil.rmtree(directory, ignore_errors=True)
    return freed
