from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace
from cluster.models import Job, Node
from serving.models import Model


class DatasetFormat(models.TextChoices):
    ALPACA = "alpaca", _("Alpaca (instruction, input, output)")
    SHAREGPT = "sharegpt", _("ShareGPT (conversations: from/value)")
    MESSAGES = "messages", _("OpenAI messages (role/content)")
    CSV = "csv", _("CSV with a column mapping")


class Dataset(models.Model):
    """Instruction data, stored once as normalised conversations (JSONL of {"messages": [...]}) under its sha256.
    Each upload of new content is a new version in the asset registry; a job records the sha256 it trained on, and
    files are never overwritten, so a job's data stays what it was."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=96)
    description = models.TextField(blank=True)
    source_format = models.CharField(max_length=16, choices=DatasetFormat.choices)
    source_filename = models.CharField(max_length=255, blank=True)
    sha256 = models.CharField(max_length=64)
    sample_count = models.PositiveIntegerField()
    # The last `validation_count` samples of the file (shuffled once, with `seed`, when stored) are held out.
    validation_count = models.PositiveIntegerField()
    seed = models.PositiveIntegerField(default=42)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_dataset_name_per_workspace")]

    def __str__(self) -> str:
        return self.name

    @property
    def train_count(self) -> int:
        return self.sample_count - self.validation_count


class JobKind(models.TextChoices):
    FINETUNE = "finetune", _("Fine-tune")
    QUANTIZE = "quantize", _("Quantize")
    PRUNE = "prune", _("Prune")
    DISTILL = "distill", _("Distill")


class DistillMode(models.TextChoices):
    SEQUENCE = "sequence", _("Sequence-level (the teacher deployment's answers)")
    LOGITS = "logits", _("Logits (the teacher's token distributions; same tokenizer)")


class Method(models.TextChoices):
    LORA = "lora", "LoRA"
    FULL = "full", _("Full")


class Stage(models.TextChoices):
    """Where a job's process stands; each stage's output is written whole before the next starts, so a job that
    runs again continues after the last finished stage."""

    QUEUED = "queued", _("Queued")
    # The process has started and reads the base model (a GGUF base is first converted to Hugging Face form).
    PREPARE = "prepare", _("Loading the base model")
    TEACH = "teach", _("Teacher answering the prompts")
    PRUNE = "prune", _("Pruning")
    TRAIN = "train", _("Training")
    MERGE = "merge", _("Merging")
    CONVERT = "convert", _("Converting to GGUF")
    QUANTIZE = "quantize", _("Quantizing")
    EVALUATE = "evaluate", _("Evaluating")
    REGISTER = "register", _("Registering")
    DONE = "done", _("Done")


class EnhancementJob(models.Model):
    """A fine-tune or compression run. It runs as a cluster Job on its node; its output is a new serving Model."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="enhancement_jobs")
    name = models.SlugField(max_length=96)
    kind = models.CharField(max_length=16, choices=JobKind.choices)
    base_model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="+")
    dataset = models.ForeignKey(Dataset, on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs")
    dataset_sha256 = models.CharField(max_length=64, blank=True)
    method = models.CharField(max_length=8, choices=Method.choices, blank=True)
    # Checked settings: steps, learning rate, batch size, LoRA rank … (enhancement/hyperparameters.py).
    hyperparameters = models.JSONField(default=dict, blank=True)
    quantizations = models.JSONField(default=list, blank=True, help_text="GGUF types to export, e.g. ['q4_k_m']")
    # Unless set, a finished job's intermediates (checkpoints, adapter, merged weights, an unasked f16 GGUF) are
    # removed once its outputs are registered.
    keep_intermediates = models.BooleanField(default=False)
    # A prune job's {method, sparsity}; a distill job's {mode, teacher, temperature, alpha, max_prompts}.
    compression = models.JSONField(default=dict, blank=True)
    # The parallelism plan the job runs with (enhancement/planner.py), and the ranked alternatives it was chosen from.
    plan = models.JSONField(default=dict, blank=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    cluster_job = models.OneToOneField(Job, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.QUEUED)
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    # The training process (its own session and process group) and its start time, to tell it from a reused pid.
    pid = models.PositiveIntegerField(null=True, blank=True)
    pid_started_at = models.FloatField(null=True, blank=True)
    report = models.JSONField(default=dict, blank=True)
    output_models = models.ManyToManyField(Model, blank=True, related_name="+")
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="unique_enhancement_job_name")]

    def __str__(self) -> str:
        return self.name

    @property
    def state(self) -> str:
        return self.cluster_job.state if self.cluster_job else "queued"


class MetricSample(models.Model):
    """One logged training step (or evaluation) of a job. A resumed run logs steps again from its checkpoint; the
    later sample of a step replaces the earlier, so the charts show each step once."""

    job = models.ForeignKey(EnhancementJob, on_delete=models.CASCADE, related_name="metrics")
    step = models.PositiveIntegerField()
    at = models.DateTimeField()
    train_loss = models.FloatField(null=True, blank=True)
    validation_loss = models.FloatField(null=True, blank=True)
    learning_rate = models.FloatField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)
    samples_per_s = models.FloatField(null=True, blank=True)
    step_time_s = models.FloatField(null=True, blank=True)
    eta_s = models.FloatField(null=True, blank=True)
    cpu_percent = models.FloatField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)
    gpu_percent = models.FloatField(null=True, blank=True)
    gpu_memory_bytes = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["job", "step"]
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="one_metric_sample_per_step")]
