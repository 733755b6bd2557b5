import json
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet
from django.utils.translation import gettext as _

from accounts.errors import NotFound, ValidationFailed
from enhancement import runner
from enhancement.files import converted_bases_dir, dataset_path
from enhancement.model_shapes import trainable_problem
from enhancement.models import Dataset, EnhancementJob, MetricSample, Stage
from enhancement.training import data
from enhancement.training.bases import tokenizer_location
from serving.models import Model


def datasets(*, workspace) -> QuerySet[Dataset]:
    return Dataset.objects.filter(workspace=workspace)


def jobs(*, workspace) -> QuerySet[EnhancementJob]:
    return EnhancementJob.objects.filter(workspace=workspace).select_related(
        "base_model", "dataset", "node", "cluster_job").prefetch_related("output_models")


def plan_why(entry: dict, best: dict) -> str:
    """Why a plan ranks where it does, in the reader's language, from its figures (the planner's own note is
    English, written where no request's language is known)."""
    names = {"compute_s": _("compute"), "overhead_s": _("per-pass overhead"), "tp_comm_s": _("TP communication"),
             "dp_comm_s": _("gradient all-reduce"), "pp_comm_s": _("pipeline transfers"),
             "bubble": _("pipeline bubble")}

    def parts(plan: dict) -> dict:
        found = {key: plan[key] for key in names if key != "bubble"}
        found["bubble"] = max(0.0, plan["step_time_s"] - sum(found.values()))
        return found

    memory = _("%(share)s of usable memory") % {
        "share": f"{entry['memory_per_device_bytes'] / entry['memory_limit_bytes']:.0%}"}
    mine = parts(entry)
    if entry is best:
        dominant = max(mine, key=mine.get)
        return _("fastest estimate; %(part)s dominates (%(seconds).3g s of %(step).3g s); %(memory)s") % {
            "part": names[dominant], "seconds": mine[dominant], "step": entry["step_time_s"], "memory": memory}
    theirs = parts(best)
    extra = {key: mine[key] - theirs[key] for key in mine}
    cause = max(extra, key=extra.get)
    if extra[cause] <= 1e-12:
        return _("as fast as #1 but uses more memory (%(memory)s)") % {"memory": memory}
    return _("%(slower)s slower than #1, mostly more %(part)s (+%(seconds).3g s); %(memory)s") % {
        "slower": f"{entry['step_time_s'] / best['step_time_s'] - 1:.0%}", "part": names[cause],
        "seconds": extra[cause], "memory": memory}


def with_reasons(plans: list[dict]) -> list[dict]:
    """The plans (best first) with their `why` in the reader's language."""
    return [{**plan, "why": plan_why(plan, plans[0]) if index else plan_why(plans[0], plans[0])}
            for index, plan in enumerate(plans)]


# Bits each weight takes in a GGUF type, roughly (llama.cpp's block formats carry their scales): to tell whether an
# output is larger than its base because it stores more bits than the base already did.
GGUF_BITS = {"F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8.5, "Q6_K": 6.6, "Q5_K_M": 5.7, "Q5_K_S": 5.5, "Q5_0": 5.5,
             "Q4_K_M": 4.9, "Q4_K_S": 4.6, "Q4_0": 4.5, "Q3_K_M": 3.9, "Q3_K_S": 3.5, "Q2_K": 3.0}


def measured_on_training_data(job: EnhancementJob) -> bool:
    """True when the job trained and its report's perplexity was measured on conversations it trained on: its
    dataset held none out (the process then measures on the last training conversations)."""
    if not job.hyperparameters or not job.dataset_sha256:
        return False
    try:
        spec = json.loads((runner.run_dir(job) / "spec.json").read_text())
        return not spec.get("eval_validation_count")
    except (OSError, ValueError):
        return job.dataset is not None and not job.dataset.validation_count


def size_note(row: dict, base: dict | None) -> str:
    """Why an output is larger than its base, when it is; '' otherwise."""
    if base is None or row is base or not row.get("size_bytes") or row["size_bytes"] <= base.get("size_bytes", 0):
        return ""
    base_bits = GGUF_BITS.get(str(base.get("quantization", "")).upper())
    output_bits = GGUF_BITS.get(str(row.get("quantization", "")).upper())
    if base_bits and output_bits and output_bits > base_bits:
        return _("Larger than the base: the base was already %(base)s, and %(output)s keeps more bits per weight, so "
                 "it grows without becoming more accurate than the base.") % {
            "base": str(base["quantization"]).upper(), "output": str(row["quantization"]).upper()}
    return _("Larger than the base: in a model this small the token-embedding and output tensors are a large share "
             "of the weights, and llama.cpp keeps them at higher precision than the rest, so the file does not "
             "shrink below the base's (%(base)s).") % {"base": str(base.get("quantization") or "—").upper()}


def report_rows(job: EnhancementJob) -> list[dict]:
    """The report's rows, each with `size_note` saying why an output outgrew its base."""
    rows = job.report.get("rows", [])
    base = next((row for row in rows if row.get("model") == "base"), None)
    return [{**row, "size_note": size_note(row, base)} for row in rows]


def measured_step_s(job: EnhancementJob) -> float | None:
    """The median time of the job's trained steps, as its process measured them."""
    times = sorted(MetricSample.objects.filter(job=job, step_time_s__isnull=False).values_list("step_time_s",
                                                                                             flat=True))
    return times[len(times) // 2] if times else None


def step_calibration(*, node, base_model, method: str) -> dict | None:
    """How the planner's step time compared with the measured one on the last job that trained this model this
    way on this node. The cost model counts every row as `cutoff` tokens; unpacked batches of short conversations
    are padded only to their longest sample, so it ran several times long (issue 33: 28.3 s planned, 3.9 s
    measured), and whatever the model leaves out (this node's real FLOPs, the other processes on it) the ratio
    carries too. None before any such job has trained."""
    for job in EnhancementJob.objects.filter(node=node, base_model=base_model, method=method).exclude(plan={}):
        estimated = (job.plan.get("chosen") or {}).get("raw_step_time_s") or (job.plan.get("chosen") or {}).get(
            "step_time_s")
        measured = measured_step_s(job)
        if estimated and measured:
            return {"job": job.name, "estimated_s": estimated, "measured_s": measured, "factor": measured / estimated}
    return None


def stage_label(job: EnhancementJob) -> str:
    """The stage as the job page shows it: a job whose worker has taken it up is starting, not queued."""
    if job.stage == Stage.QUEUED and job.state == "running":
        return _("Starting")
    return job.get_stage_display()


def job_disk_bytes(job: EnhancementJob) -> int | None:
    """What the job's run directory holds on disk; None when it lies on another node's disk."""
    if job.node.name != settings.NODE_NAME:
        return None
    return runner.disk_bytes(runner.run_dir(job))


def scoped(queryset: QuerySet, pk, what: str):
    found = queryset.filter(pk=pk).first() if str(pk).isdigit() else None
    if found is None:
        raise NotFound(f"{what} {pk} not found in this workspace.")
    return found


def dataset_preview(*, dataset: Dataset, model: Model, cutoff: int, samples: int = 3) -> dict:
    """Samples rendered exactly as training will render them (the model's served chat template and tokenizer),
    with every sample's token length in a histogram and the share over the cutoff."""
    problem = trainable_problem(model)
    if problem:
        raise ValidationFailed(problem, fields={"model": [problem]})
    if not model.chat_template:
        raise ValidationFailed(f"'{model.name}' has no chat template; set one on Models & Serving to preview how "
                               f"it will see the data.", fields={"model": ["No chat template."]})
    if not 16 <= cutoff <= 32_768:
        raise ValidationFailed("The cutoff must be between 16 and 32768 tokens.", fields={"cutoff": ["Out of range."]})
    conversations = data.read_conversations(dataset_path(dataset.sha256))
    tokenizer = data.load_tokenizer(str(tokenizer_location(Path(model.path), converted_bases_dir())))
    try:
        rendered = [data.render(tokenizer, c, model.chat_template) for c in conversations[:samples]]
    except Exception as exc:  # a template error is the user's template's, shown in their words
        raise ValidationFailed(f"The chat template of '{model.name}' failed on this data: {exc}",
                               fields={"model": [str(exc)]})
    lengths = data.token_lengths(tokenizer, conversations, model.chat_template)
    return {"model": model.name, "cutoff": cutoff, "samples": rendered,
            "histogram": data.histogram(lengths, cutoff), "train_count": dataset.train_count,
            "validation_count": dataset.validation_count}


def metric_series(*, job: EnhancementJob, since_step: int = -1) -> list[dict]:
    rows = MetricSample.objects.filter(job=job, step__gt=since_step).order_by("step")
    return [{"step": r.step, "at": r.at.isoformat(), "train_loss": r.train_loss,
             "validation_loss": r.validation_loss, "learning_rate": r.learning_rate, "tokens_per_s": r.tokens_per_s,
             "samples_per_s": r.samples_per_s, "step_time_s": r.step_time_s, "eta_s": r.eta_s,
             "cpu_percent": r.cpu_percent, "memory_bytes": r.memory_bytes, "gpu_percent": r.gpu_percent,
             "gpu_memory_bytes": r.gpu_memory_bytes} for r in rows]
