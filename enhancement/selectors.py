from pathlib import Path

from django.db.models import QuerySet

from accounts.errors import NotFound, ValidationFailed
from enhancement.files import converted_bases_dir, dataset_path
from enhancement.model_shapes import trainable_problem
from enhancement.models import Dataset, EnhancementJob, MetricSample
from enhancement.training import data
from enhancement.training.bases import tokenizer_location
from serving.models import Model


def datasets(*, workspace) -> QuerySet[Dataset]:
    return Dataset.objects.filter(workspace=workspace)


def jobs(*, workspace) -> QuerySet[EnhancementJob]:
    return EnhancementJob.objects.filter(workspace=workspace).select_related(
        "base_model", "dataset", "node", "cluster_job").prefetch_related("output_models")


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
