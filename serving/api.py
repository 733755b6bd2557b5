from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response

from accounts.permissions import WorkspaceScopedMixin
from cluster import services as cluster_services
from cluster.api import QueuePlaceSerializer
from cluster.models import Node
from serving import selectors, services
from serving.engines.base import engine
from serving.groups import services as group_services
from serving.groups.calibration import MAX_ITEMS
from serving.groups.scoring import METRICS
from serving.models import (
    CalibrationRun,
    Deployment,
    Engine,
    GroupPolicy,
    GroupRequest,
    Model,
    ModelGroup,
    Replica,
    RequestRecord,
    RoleHint,
    ServingEvent,
)


class ModelSerializer(serializers.ModelSerializer):
    shared = serializers.SerializerMethodField()
    supports_chat = serializers.BooleanField(read_only=True)
    has_chat_template = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "name", "kind", "path", "url", "family", "parameter_count", "quantization",
                  "context_length", "embedding_dimensions", "role_hint", "size_bytes", "supports_chat",
                  "has_chat_template", "shared", "created_at"]

    def get_shared(self, obj) -> bool:
        return obj.workspace_id is None

    def get_has_chat_template(self, obj) -> bool:
        return bool(obj.chat_template)


class ModelRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=96)
    path = serializers.CharField(required=False, allow_blank=True, default="")
    url = serializers.CharField(required=False, allow_blank=True, default="")
    api_key = serializers.CharField(required=False, allow_blank=True, default="", write_only=True)
    role_hint = serializers.ChoiceField(choices=RoleHint.choices, default=RoleHint.SMALL)
    chat_template = serializers.CharField(required=False, allow_blank=True, default=None)


class ChatTemplateSerializer(serializers.Serializer):
    chat_template = serializers.CharField(allow_blank=True, trim_whitespace=False,
                                          help_text="Jinja chat template; blank restores the model file's own")


class ReplicaSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    queue = serializers.SerializerMethodField(help_text="Where a replica's queued start stands in its node's line.")

    class Meta:
        model = Replica
        fields = ["id", "node", "weight", "state", "queue", "base_url", "pid", "restarts", "last_error",
                  "last_health_at"]

    @extend_schema_field(QueuePlaceSerializer(allow_null=True))
    def get_queue(self, replica) -> dict | None:
        start = selectors.queued_start(replica)
        if start is None:
            return None
        place = cluster_services.job_place(cluster_services.job_line(replica.node), start)
        return place.as_dict() if place else None


class DeploymentSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    replicas = ReplicaSerializer(many=True, read_only=True)
    capabilities = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = ["id", "name", "model", "engine", "settings", "state", "desired_running", "cooldown_s",
                  "tool_strategy", "capabilities", "replicas", "created_at"]

    def get_capabilities(self, obj) -> list[str]:
        return sorted(engine(obj.engine).capabilities(obj.model))


class ReplicaSpecSerializer(serializers.Serializer):
    node = serializers.SlugRelatedField(slug_field="name", queryset=Node.objects.all())
    weight = serializers.FloatField(default=1.0)


class DeploymentCreateSerializer(serializers.Serializer):
    model = serializers.CharField(help_text="Name of a registered model")
    name = serializers.CharField(required=False, allow_blank=True, default="")
    engine = serializers.ChoiceField(choices=Engine.choices, required=False, allow_blank=True, default="")
    settings = serializers.JSONField(required=False, default=dict)
    replicas = ReplicaSpecSerializer(many=True, required=False)
    cooldown_s = serializers.FloatField(required=False, default=30.0)
    start = serializers.BooleanField(default=True)


class RoutingSerializer(serializers.Serializer):
    cooldown_s = serializers.FloatField(required=False)
    weights = serializers.DictField(child=serializers.FloatField(), required=False,
                                    help_text="Replica id to weight")


class ServingEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServingEvent
        fields = ["replica", "from_state", "to_state", "message", "at"]


class RequestRecordSerializer(serializers.ModelSerializer):
    class Meta:
        model = RequestRecord
        fields = ["id", "request_id", "replica", "endpoint", "stream", "status", "attempts",
                  "ttft_ms", "tpot_ms", "itl_mean_ms",
                  "e2e_ms", "input_tokens", "output_tokens", "error", "created_at"]


class ModelViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Registered models: the presets shared by every workspace, and this workspace's own."""

    serializer_class = ModelSerializer

    def get_queryset(self):
        return selectors.models_visible_to(workspace=self.workspace)

    @extend_schema(responses={204: None, 409: dict})
    def destroy(self, request, pk=None):
        """Remove the model from the registry; refused (409, naming them) while a deployment, group, job or
        knowledge base uses it."""
        services.delete_model(actor=self.actor, model=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=ModelRegisterSerializer, responses={201: ModelSerializer})
    def create(self, request):
        data = ModelRegisterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model = services.register_model(actor=self.actor, workspace=self.workspace, **data.validated_data)
        return Response(ModelSerializer(model).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ChatTemplateSerializer, responses=ModelSerializer)
    @action(detail=True, methods=["post"], url_path="chat-template")
    def chat_template(self, request, pk=None):
        """Set the chat template llama-server formats chat requests with; a base model gains chat with one."""
        data = ChatTemplateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model = services.set_chat_template(actor=self.actor, workspace=self.workspace, model=self.get_object(),
                                           chat_template=data.validated_data["chat_template"])
        return Response(ModelSerializer(model).data)

    @extend_schema(request=None, responses={201: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def deploy(self, request, pk=None):
        """One click: deploy this model on this node with its default engine, and start it. When the workspace
        already has a deployment of it, that one is started and returned (200) instead of a second made."""
        deployment, created = services.deploy_model(actor=self.actor, workspace=self.workspace,
                                                    model=self.get_object())
        return Response(DeploymentSerializer(deployment).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class DeploymentViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet):
    """Deployments: a model, an engine and weighted replicas. Start and stop run as jobs on each replica's node."""

    serializer_class = DeploymentSerializer
    lookup_field = "name"

    def get_queryset(self):
        return selectors.deployments_visible_to(workspace=self.workspace)

    @extend_schema(request=DeploymentCreateSerializer, responses={201: DeploymentSerializer})
    def create(self, request):
        data = DeploymentCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        model = selectors.models_visible_to(workspace=self.workspace).filter(name=spec["model"]).first()
        if model is None:
            raise serializers.ValidationError({"model": [f"No model called '{spec['model']}'."]})
        replicas = [(r["node"], r["weight"]) for r in spec.get("replicas") or []]
        deployment = services.create_deployment(
            actor=self.actor, workspace=self.workspace, model=model, name=spec["name"], engine_name=spec["engine"],
            settings_=spec["settings"], replicas=replicas or None, cooldown_s=spec["cooldown_s"])
        if spec["start"]:
            deployment = services.start_deployment(actor=self.actor, deployment=deployment)
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, 409: dict})
    def destroy(self, request, name=None):
        """Stop the deployment's engines and remove it; refused (409, naming them) while a model group, a RAG
        config, an agent or a knowledge base uses it."""
        services.delete_deployment(actor=self.actor, deployment=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def start(self, request, name=None):
        deployment = services.start_deployment(actor=self.actor, deployment=self.get_object())
        return Response(DeploymentSerializer(deployment).data)

    @extend_schema(request=None, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request, name=None):
        deployment = services.stop_deployment(actor=self.actor, deployment=self.get_object())
        return Response(DeploymentSerializer(deployment).data)

    @extend_schema(request=RoutingSerializer, responses=DeploymentSerializer)
    @action(detail=True, methods=["patch"])
    def routing(self, request, name=None):
        data = RoutingSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        weights = {int(k): v for k, v in (data.validated_data.get("weights") or {}).items()}
        deployment = services.update_routing(actor=self.actor, deployment=self.get_object(),
                                             cooldown_s=data.validated_data.get("cooldown_s"), weights=weights)
        return Response(DeploymentSerializer(deployment).data)

    @extend_schema(responses=ServingEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, name=None):
        return Response(ServingEventSerializer(self.get_object().events.all()[:200], many=True).data)

    @extend_schema(responses=RequestRecordSerializer(many=True))
    @action(detail=True, methods=["get"])
    def requests(self, request, name=None):
        records = self.get_object().requests.filter(selectors.own_or_shared(self.workspace))[:100]
        return Response(RequestRecordSerializer(records, many=True).data)

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def engine(self, request, name=None):
        """Each ready replica's load as its engine reports it: slots busy of total, requests waiting for a slot,
        KV cache in use, token counters and speeds."""
        stats = selectors.engine_stats(deployment=self.get_object())
        return Response({"replicas": {str(replica_id): figures for replica_id, figures in stats.items()}})

    @extend_schema(parameters=[OpenApiParameter("minutes", int)], responses=dict)
    @action(detail=True, methods=["get"])
    def metrics(self, request, name=None):
        minutes = serializers.IntegerField(min_value=1, max_value=7 * 24 * 60).run_validation(
            request.query_params.get("minutes", 60))
        return Response(selectors.metrics_summary(deployment=self.get_object(), minutes=minutes))


class RequestRecordViewSet(WorkspaceScopedMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """One gateway request's figures, by the X-Request-Id the gateway returned with it."""

    queryset = RequestRecord.objects.all()
    serializer_class = RequestRecordSerializer
    lookup_field = "request_id"


class ModelGroupSerializer(serializers.ModelSerializer):
    big = serializers.SlugRelatedField(slug_field="name", read_only=True)
    small = serializers.SlugRelatedField(slug_field="name", read_only=True)
    draft = serializers.SlugRelatedField(slug_field="name", read_only=True)
    speculative_deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    shared = serializers.SerializerMethodField()

    class Meta:
        model = ModelGroup
        fields = ["id", "name", "policy", "big", "small", "draft", "speculative_deployment", "threshold", "settings",
                  "shared", "created_at", "updated_at"]

    def get_shared(self, obj) -> bool:
        return obj.workspace_id is None


class ModelGroupCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=96)
    policy = serializers.ChoiceField(choices=GroupPolicy.choices)
    big = serializers.CharField(help_text="Name of the big member's deployment")
    small = serializers.CharField(required=False, allow_blank=True, default="",
                                  help_text="Name of the small member's deployment (route, cascade)")
    draft = serializers.CharField(required=False, allow_blank=True, default="",
                                  help_text="Speculative: name of the draft model (default: the small member's)")
    threshold = serializers.FloatField(default=0.5)
    settings = serializers.JSONField(required=False, default=dict)


class ModelGroupUpdateSerializer(serializers.Serializer):
    policy = serializers.ChoiceField(choices=GroupPolicy.choices, required=False)
    small = serializers.CharField(required=False)
    threshold = serializers.FloatField(required=False)
    settings = serializers.JSONField(required=False)


class GroupRequestSerializer(serializers.ModelSerializer):
    class Meta:
        model = GroupRequest
        fields = ["request_id", "policy", "member", "score", "threshold", "escalated", "reason", "fallback", "status",
                  "small_input_tokens", "small_output_tokens", "big_input_tokens", "big_output_tokens", "small_cost",
                  "big_cost", "created_at"]


class CalibrationStartSerializer(serializers.Serializer):
    items = serializers.JSONField(required=False, help_text=f"[{{prompt, reference}}], at most {MAX_ITEMS}")
    file = serializers.FileField(required=False, help_text="JSONL: one {prompt, reference} per line")
    prompt_source = serializers.CharField(required=False, help_text="A studio's prompt sets: rag-eval-set, "
                                                                    "agent-scenarios")
    prompt_set = serializers.IntegerField(required=False, help_text="The eval set's or agent's id")
    source = serializers.CharField(required=False, max_length=200, default="API")
    metric = serializers.ChoiceField(choices=METRICS, default="token_f1")
    max_tokens = serializers.IntegerField(default=128)
    temperature = serializers.FloatField(default=0.2)
    judge = serializers.CharField(required=False, allow_blank=True, default="",
                                  help_text="A chat deployment or group that grades each answer (metric: judge)")

    def validate(self, attrs):
        if sum(key in attrs for key in ("items", "file", "prompt_source")) != 1:
            raise serializers.ValidationError({"items": ["Give one of 'items', a JSONL 'file', or a "
                                                         "'prompt_source' with its 'prompt_set'."]})
        if "prompt_source" in attrs and "prompt_set" not in attrs:
            raise serializers.ValidationError({"prompt_set": ["Name the set of the prompt source (its id)."]})
        return attrs


class CalibrationRunSerializer(serializers.ModelSerializer):
    group = serializers.SlugRelatedField(slug_field="name", read_only=True)
    queue = serializers.SerializerMethodField(help_text="Where a queued run stands in the interactive line.")

    class Meta:
        model = CalibrationRun
        fields = ["id", "group", "state", "queue", "source", "metric", "judge", "max_tokens", "temperature", "curves",
                  "summary", "chosen", "error", "created_at", "finished_at"]

    @extend_schema_field(QueuePlaceSerializer(allow_null=True))
    def get_queue(self, run) -> dict | None:
        place = group_services.calibration_place(run)
        return place.as_dict() if place else None


class CalibrationRunDetailSerializer(CalibrationRunSerializer):
    class Meta(CalibrationRunSerializer.Meta):
        fields = CalibrationRunSerializer.Meta.fields + ["items", "outcomes"]


class PickPointSerializer(serializers.Serializer):
    policy = serializers.ChoiceField(choices=[GroupPolicy.ROUTE, GroupPolicy.CASCADE, "route-classifier"])
    threshold = serializers.FloatField()


def _deployment_named(workspace, name: str, field: str) -> Deployment | None:
    if not name:
        return None
    deployment = selectors.deployments_visible_to(workspace=workspace).filter(name=name).first()
    if deployment is None:
        raise serializers.ValidationError({field: [f"No deployment called '{name}'."]})
    return deployment


class ModelGroupViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Model groups: one name in /v1 over a big and a small deployment, and the policy that picks per request."""

    serializer_class = ModelGroupSerializer
    lookup_field = "name"
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self):
        return selectors.groups_visible_to(workspace=self.workspace)

    @extend_schema(request=ModelGroupCreateSerializer, responses={201: ModelGroupSerializer})
    def create(self, request):
        data = ModelGroupCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        draft = None
        if spec["draft"]:
            draft = selectors.models_visible_to(workspace=self.workspace).filter(name=spec["draft"]).first()
            if draft is None:
                raise serializers.ValidationError({"draft": [f"No model called '{spec['draft']}'."]})
        group = group_services.create_group(
            actor=self.actor, workspace=self.workspace, name=spec["name"], policy=spec["policy"],
            big=_deployment_named(self.workspace, spec["big"], "big"),
            small=_deployment_named(self.workspace, spec["small"], "small"), draft=draft,
            threshold=spec["threshold"], settings=spec["settings"])
        return Response(ModelGroupSerializer(group).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ModelGroupUpdateSerializer, responses=ModelGroupSerializer)
    def partial_update(self, request, name=None):
        data = ModelGroupUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        group = group_services.update_group(
            actor=self.actor, group=self.get_object(), policy=spec.get("policy"), threshold=spec.get("threshold"),
            settings=spec.get("settings"), small=_deployment_named(self.workspace, spec.get("small", ""), "small"))
        return Response(ModelGroupSerializer(group).data)

    def perform_destroy(self, instance):
        group_services.delete_group(actor=self.actor, group=instance)

    @extend_schema(responses=GroupRequestSerializer(many=True))
    @action(detail=True, methods=["get"])
    def requests(self, request, name=None):
        """The latest requests through the group: which member answered, why, and what each member's tokens cost."""
        records = self.get_object().requests.filter(selectors.own_or_shared(self.workspace))[:100]
        return Response(GroupRequestSerializer(records, many=True).data)

    @extend_schema(parameters=[OpenApiParameter("minutes", int)], responses=dict)
    @action(detail=True, methods=["get"])
    def share(self, request, name=None):
        """The share of requests each member answered, with tokens and cost, overall and over time."""
        minutes = serializers.IntegerField(min_value=1, max_value=7 * 24 * 60).run_validation(
            request.query_params.get("minutes", 60))
        return Response(selectors.group_share_summary(group=self.get_object(), workspace=self.workspace,
                                                      minutes=minutes))

    @extend_schema(request=CalibrationStartSerializer, responses={202: CalibrationRunSerializer})
    @action(detail=True, methods=["post"])
    def calibrate(self, request, name=None):
        """Run both members on prompt/reference pairs (a list, or a JSONL file) and draw the cost-quality curve."""
        data = CalibrationStartSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        items = spec.get("items")
        source = spec["source"]
        if "file" in spec:
            items = group_services.calibration_items_from_file(content=spec["file"].read())
            source = f"uploaded {spec['file'].name}"
        elif "prompt_source" in spec:
            items, source = group_services.calibration_items_from_source(
                workspace=self.workspace, source=spec["prompt_source"], set_id=spec["prompt_set"])
        run = group_services.start_calibration(
            actor=self.actor, workspace=self.workspace, group=self.get_object(), items=items, source=source,
            metric=spec["metric"], max_tokens=spec["max_tokens"], temperature=spec["temperature"],
            judge=spec["judge"])
        return Response(CalibrationRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=CalibrationRunSerializer(many=True))
    @action(detail=True, methods=["get"])
    def calibrations(self, request, name=None):
        runs = self.get_object().calibrations.filter(workspace=self.workspace)[:50]
        return Response(CalibrationRunSerializer(runs, many=True).data)


class CalibrationRunViewSet(WorkspaceScopedMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A calibration run of this workspace, with its prompts, every answer and score, and its curves."""

    queryset = CalibrationRun.objects.select_related("group")
    serializer_class = CalibrationRunDetailSerializer

    @extend_schema(request=PickPointSerializer, responses=ModelGroupSerializer)
    @action(detail=True, methods=["post"])
    def pick(self, request, pk=None):
        """Set the group's policy and threshold to this point of the run's curve."""
        data = PickPointSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        group = group_services.pick_calibration_point(actor=self.actor, run=self.get_object(),
                                                      **data.validated_data)
        return Response(ModelGroupSerializer(group).data)

    @extend_schema(request=None, responses=CalibrationRunDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the calibration; the answers so far are kept."""
        run = group_services.cancel_calibration(actor=self.actor, run=self.get_object())
        return Response(CalibrationRunDetailSerializer(run).data)
