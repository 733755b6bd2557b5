from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import WorkspaceRole, WorkspaceScopedMixin, request_actor, request_workspace
from cluster import services as cluster_services
from cluster.api import QueuePlaceSerializer
from cluster.models import Node
from enhancement import runner, selectors, services
from enhancement.formats import ColumnMapping
from enhancement.models import Dataset, DatasetFormat, DistillMode, EnhancementJob, Method
from enhancement.training.export import QUANTIZATIONS
from enhancement.training.pruning import METHODS as PRUNE_METHODS
from serving.api import DeploymentSerializer
from serving.selectors import deployments_visible_to, models_visible_to


class DatasetSerializer(serializers.ModelSerializer):
    train_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Dataset
        fields = ["id", "name", "description", "source_format", "source_filename", "sha256", "sample_count",
                  "train_count", "validation_count", "seed", "created_at", "updated_at"]


class DatasetUploadSerializer(serializers.Serializer):
    file = serializers.FileField()
    name = serializers.CharField(max_length=96)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    format = serializers.ChoiceField(choices=DatasetFormat.choices, required=False, allow_blank=True, default="",
                                     help_text="Detected from the first line when blank")
    validation_share = serializers.FloatField(required=False, default=0.1)
    seed = serializers.IntegerField(required=False, default=42, min_value=0)
    instruction_column = serializers.CharField(required=False, default="instruction", help_text="CSV only")
    input_column = serializers.CharField(required=False, allow_blank=True, default="", help_text="CSV only")
    output_column = serializers.CharField(required=False, default="output", help_text="CSV only")
    system_column = serializers.CharField(required=False, allow_blank=True, default="", help_text="CSV only")


def _model_named(workspace, name: str):
    model = models_visible_to(workspace=workspace).filter(name=name).first()
    if model is None:
        raise serializers.ValidationError({"model": [f"No model called '{name}'."]})
    return model


def _node_named(name: str) -> Node:
    node = Node.objects.filter(name=name or settings.NODE_NAME).first()
    if node is None:
        raise serializers.ValidationError({"node": [f"No node called '{name}'."]})
    return node


class DatasetViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Instruction datasets: alpaca, ShareGPT or OpenAI-messages JSONL, or CSV with a column mapping."""

    queryset = Dataset.objects.all()
    serializer_class = DatasetSerializer
    parser_classes = [MultiPartParser, FormParser, JSONParser]

    @extend_schema(request={"multipart/form-data": DatasetUploadSerializer}, responses={201: DatasetSerializer})
    def create(self, request):
        """Upload a file; every line is checked, and a broken one is named with its line number. The same name
        again makes a new version."""
        data = DatasetUploadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        dataset = services.upload_dataset(
            actor=self.actor, workspace=self.workspace, name=spec["name"], filename=spec["file"].name,
            content=spec["file"].read(), source_format=spec["format"], description=spec["description"],
            validation_share=spec["validation_share"], seed=spec["seed"],
            mapping=ColumnMapping(instruction=spec["instruction_column"], output=spec["output_column"],
                                  input=spec["input_column"], system=spec["system_column"]))
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={201: DatasetSerializer})
    @action(detail=False, methods=["post"])
    def sample(self, request):
        """Add the instruction dataset shipped with the platform to this workspace."""
        dataset = services.import_sample_dataset(actor=self.actor, workspace=self.workspace)
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("model", str, required=True), OpenApiParameter("cutoff", int)],
                   responses=dict)
    @action(detail=True, methods=["get"])
    def preview(self, request, pk=None):
        """Samples rendered with the model's served chat template, and the token-length histogram."""
        cutoff = serializers.IntegerField().run_validation(request.query_params.get("cutoff", 512))
        model = _model_named(self.workspace, request.query_params.get("model", ""))
        return Response(selectors.dataset_preview(dataset=self.get_object(), model=model, cutoff=cutoff))


class DeviceGroupSerializer(serializers.Serializer):
    count = serializers.IntegerField(min_value=1, max_value=4096)
    memory_gb = serializers.FloatField(min_value=0.001)
    tflops = serializers.FloatField(min_value=0.001)
    nodes = serializers.IntegerField(min_value=1, default=1)
    kind = serializers.ChoiceField(choices=["gpu", "cpu"], default="gpu")


class PlanRequestSerializer(serializers.Serializer):
    model = serializers.CharField(help_text="Name of a registered model")
    method = serializers.ChoiceField(choices=Method.choices, default=Method.LORA)
    sequence_length = serializers.IntegerField(min_value=1, max_value=1_048_576, default=512)
    batch_size = serializers.IntegerField(min_value=1, max_value=65_536, default=4)
    lora_rank = serializers.IntegerField(min_value=1, max_value=1024, default=8)
    nodes = serializers.ListField(child=serializers.CharField(), required=False, default=list,
                                  help_text="Nodes of the pool to plan for")
    devices = DeviceGroupSerializer(many=True, required=False, help_text="Hardware entered by hand")


class PlanView(APIView):
    """Rank TP × PP × DP layouts, micro-batch, ZeRO stage and recompute for a model on a set of devices."""

    permission_classes = [WorkspaceRole]

    @extend_schema(request=PlanRequestSerializer, responses=dict)
    def post(self, request):
        data = PlanRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        nodes = [_node_named(name) for name in spec["nodes"]]
        devices = services.plan_devices(nodes=nodes, manual=spec.get("devices"))
        result = services.plan_training(model=_model_named(request_workspace(request), spec["model"]),
                                        method=spec["method"], sequence_length=spec["sequence_length"],
                                        batch_size=spec["batch_size"], devices=devices, lora_rank=spec["lora_rank"])
        return Response(result.as_dict())


class JobSerializer(serializers.ModelSerializer):
    base_model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    dataset = serializers.SlugRelatedField(slug_field="name", read_only=True)
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    state = serializers.CharField(read_only=True)
    outputs = serializers.SerializerMethodField()
    queue = serializers.SerializerMethodField(help_text="Where a queued job stands in its node's line.")
    disk_bytes = serializers.SerializerMethodField(help_text="What the job's files hold on its node's disk (null "
                                                             "when they are on another node).")

    class Meta:
        model = EnhancementJob
        fields = ["id", "name", "kind", "state", "queue", "stage", "step", "total_steps", "base_model", "dataset",
                  "dataset_sha256", "method", "hyperparameters", "quantizations", "keep_intermediates",
                  "compression", "plan", "node", "report", "outputs", "disk_bytes", "error", "created_at"]

    def get_disk_bytes(self, obj) -> int | None:
        return selectors.job_disk_bytes(obj)

    def get_outputs(self, obj) -> list[dict]:
        return [{"id": m.pk, "name": m.name, "quantization": m.quantization, "size_bytes": m.size_bytes}
                for m in obj.output_models.all()]

    @extend_schema_field(QueuePlaceSerializer(allow_null=True))
    def get_queue(self, job) -> dict | None:
        if job.cluster_job is None:
            return None
        place = cluster_services.job_place(cluster_services.job_line(job.node), job.cluster_job)
        return place.as_dict() if place else None


class FinetuneSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    base_model = serializers.CharField(help_text="Name of a registered GGUF or Hugging Face model")
    dataset = serializers.IntegerField(help_text="Dataset id")
    node = serializers.CharField(required=False, default="", allow_blank=True, help_text="This node when blank")
    more_nodes = serializers.ListField(child=serializers.CharField(), required=False, default=list,
                                       help_text="Further nodes to train across, data-parallel on a Ray cluster "
                                                 "that spans them (RAY_ADDRESS on the first node's worker)")
    method = serializers.ChoiceField(choices=Method.choices, default=Method.LORA)
    hyperparameters = serializers.DictField(required=False, default=dict)
    quantizations = serializers.ListField(child=serializers.ChoiceField(choices=list(QUANTIZATIONS)),
                                          default=["q4_k_m"])
    keep_intermediates = serializers.BooleanField(default=False, help_text="Keep checkpoints, merged weights and "
                                                  "the f16 GGUF once the outputs are registered")
    priority = serializers.CharField(default="normal", help_text="The pool's class: low, normal (developers), "
                                                                 "high (admins), urgent (owners)")


class QuantizeSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    base_model = serializers.CharField()
    quantizations = serializers.ListField(child=serializers.ChoiceField(choices=list(QUANTIZATIONS)))
    dataset = serializers.IntegerField(required=False, allow_null=True, default=None,
                                       help_text="Its validation split is the report's held-out text")
    node = serializers.CharField(required=False, default="", allow_blank=True)
    keep_intermediates = serializers.BooleanField(default=False, help_text="Keep checkpoints, merged weights and "
                                                  "the f16 GGUF once the outputs are registered")


class PruneSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    base_model = serializers.CharField()
    method = serializers.ChoiceField(choices=list(PRUNE_METHODS), help_text="magnitude (unstructured) or "
                                     "mlp_channels (structured: whole MLP channels)")
    sparsity = serializers.FloatField(help_text="Share of the weights (or MLP channels) to remove")
    recovery_steps = serializers.IntegerField(min_value=0, max_value=100_000, default=0,
                                              help_text="A short LoRA fine-tune on the dataset afterwards")
    dataset = serializers.IntegerField(required=False, allow_null=True, default=None)
    hyperparameters = serializers.DictField(required=False, default=dict, help_text="Of the recovery fine-tune")
    quantizations = serializers.ListField(child=serializers.ChoiceField(choices=list(QUANTIZATIONS)),
                                          default=["q8_0"])
    node = serializers.CharField(required=False, default="", allow_blank=True)
    keep_intermediates = serializers.BooleanField(default=False, help_text="Keep checkpoints, merged weights and "
                                                  "the f16 GGUF once the outputs are registered")


class DistillSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    student = serializers.CharField(help_text="The model to teach (GGUF or Hugging Face)")
    dataset = serializers.IntegerField(help_text="Its prompts (sequence) or conversations (logits)")
    mode = serializers.ChoiceField(choices=DistillMode.choices)
    teacher = serializers.CharField(help_text="sequence: a ready chat deployment; logits: a model with the "
                                              "student's tokenizer")
    method = serializers.ChoiceField(choices=Method.choices, default=Method.LORA)
    hyperparameters = serializers.DictField(required=False, default=dict)
    quantizations = serializers.ListField(child=serializers.ChoiceField(choices=list(QUANTIZATIONS)),
                                          default=["q4_k_m"])
    temperature = serializers.FloatField(default=2.0, help_text="logits only")
    alpha = serializers.FloatField(default=0.5, help_text="logits only: the KL term's share of the loss")
    max_prompts = serializers.IntegerField(default=200, help_text="sequence only: training prompts the teacher answers")
    node = serializers.CharField(required=False, default="", allow_blank=True)
    keep_intermediates = serializers.BooleanField(default=False, help_text="Keep checkpoints, merged weights and "
                                                  "the f16 GGUF once the outputs are registered")


class DeploySerializer(serializers.Serializer):
    model = serializers.CharField(help_text="Name of one of the job's output models")
    node = serializers.CharField(required=False, default="", allow_blank=True,
                                 help_text="This server's node when blank")


class JobViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Fine-tune and compression jobs. Each runs as a cluster job on its node; its outputs are new models."""

    queryset = EnhancementJob.objects.all()
    serializer_class = JobSerializer

    def get_queryset(self):
        return selectors.jobs(workspace=self.workspace)

    @extend_schema(request=FinetuneSerializer, responses={201: JobSerializer})
    def create(self, request):
        """A fine-tune job: the best data-parallel plan on the nodes' devices decides the workers and the
        micro-batch; the job records it."""
        data = FinetuneSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        dataset = selectors.scoped(selectors.datasets(workspace=self.workspace), spec["dataset"], "Dataset")
        job = services.create_finetune_job(
            actor=self.actor, workspace=self.workspace, name=spec["name"],
            base_model=_model_named(self.workspace, spec["base_model"]), dataset=dataset,
            node=_node_named(spec["node"]), method=spec["method"], hyperparameters=spec["hyperparameters"],
            quantizations=spec["quantizations"], more_nodes=[_node_named(name) for name in spec["more_nodes"]],
            keep_intermediates=spec["keep_intermediates"], priority=spec["priority"])
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=QuantizeSerializer, responses={201: JobSerializer})
    @action(detail=False, methods=["post"])
    def quantize(self, request):
        """A compression job: GGUF Q8_0 / Q4_K_M (and f16 from a Hugging Face model), with a before/after report."""
        data = QuantizeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        dataset = (selectors.scoped(selectors.datasets(workspace=self.workspace), spec["dataset"], "Dataset")
                   if spec["dataset"] else None)
        job = services.create_quantize_job(
            actor=self.actor, workspace=self.workspace, name=spec["name"],
            base_model=_model_named(self.workspace, spec["base_model"]), node=_node_named(spec["node"]),
            quantizations=spec["quantizations"], dataset=dataset, keep_intermediates=spec["keep_intermediates"])
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=PruneSerializer, responses={201: JobSerializer})
    @action(detail=False, methods=["post"])
    def prune(self, request):
        """A compression job: magnitude or MLP-channel pruning, an optional recovery fine-tune, GGUF export and a
        before/after report."""
        data = PruneSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        dataset = (selectors.scoped(selectors.datasets(workspace=self.workspace), spec["dataset"], "Dataset")
                   if spec["dataset"] else None)
        job = services.create_prune_job(
            actor=self.actor, workspace=self.workspace, name=spec["name"],
            base_model=_model_named(self.workspace, spec["base_model"]), node=_node_named(spec["node"]),
            method=spec["method"], sparsity=spec["sparsity"], recovery_steps=spec["recovery_steps"],
            dataset=dataset, quantizations=spec["quantizations"], hyperparameters=spec["hyperparameters"],
            keep_intermediates=spec["keep_intermediates"])
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=DistillSerializer, responses={201: JobSerializer})
    @action(detail=False, methods=["post"])
    def distill(self, request):
        """A distillation job: the student fine-tuned on a teacher deployment's answers (sequence), or on a
        same-tokenizer teacher model's token distributions (logits)."""
        data = DistillSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        teacher_deployment = teacher_model = None
        if spec["mode"] == DistillMode.SEQUENCE:
            teacher_deployment = deployments_visible_to(workspace=self.workspace).filter(name=spec["teacher"]).first()
            if teacher_deployment is None:
                raise serializers.ValidationError({"teacher": [f"No deployment called '{spec['teacher']}'."]})
        else:
            teacher_model = _model_named(self.workspace, spec["teacher"])
        job = services.create_distill_job(
            actor=self.actor, workspace=self.workspace, name=spec["name"],
            student=_model_named(self.workspace, spec["student"]),
            dataset=selectors.scoped(selectors.datasets(workspace=self.workspace), spec["dataset"], "Dataset"),
            node=_node_named(spec["node"]), mode=spec["mode"], teacher_deployment=teacher_deployment,
            teacher_model=teacher_model, method=spec["method"], hyperparameters=spec["hyperparameters"],
            quantizations=spec["quantizations"], temperature=spec["temperature"], alpha=spec["alpha"],
            max_prompts=spec["max_prompts"], keep_intermediates=spec["keep_intermediates"])
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("since", int)], responses=dict)
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """The job's logged steps after `since`: losses, learning rate, speed, ETA, CPU/GPU use and memory."""
        since = serializers.IntegerField(min_value=-1).run_validation(request.query_params.get("since", -1))
        job = self.get_object()
        return Response({"state": job.state, "stage": job.stage, "step": job.step, "total_steps": job.total_steps,
                         "samples": selectors.metric_series(job=job, since_step=since)})

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def log(self, request, pk=None):
        """The last lines of the job's process log."""
        return Response({"log": runner.log_tail(self.get_object(), 60)})

    @extend_schema(responses={204: None, 409: dict})
    def destroy(self, request, pk=None):
        """Delete the job, its output models and its files (a running job is cancelled first); refused (409,
        naming them) while a deployment or another job uses one of its outputs."""
        services.delete_job(actor=self.actor, job=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = services.cancel_job(actor=self.actor, job=self.get_object())
        return Response(JobSerializer(job).data)

    @extend_schema(request=DeploySerializer, responses={201: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def deploy(self, request, pk=None):
        """One click: serve one of the job's output models, on the named node or this server's."""
        data = DeploySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = self.get_object()
        model = job.output_models.filter(name=data.validated_data["model"]).first()
        if model is None:
            raise serializers.ValidationError({"model": [f"'{data.validated_data['model']}' is not an output of "
                                                         f"job '{job.name}'."]})
        node = _node_named(data.validated_data["node"]) if data.validated_data["node"] else None
        deployment = services.deploy_output(actor=request_actor(request), job=job, model=model, node=node)
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)
