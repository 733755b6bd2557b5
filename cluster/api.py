from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Workspace
from accounts.permissions import WorkspaceRole, WorkspaceScopedMixin, request_actor, request_workspace
from accounts.services import is_platform_admin, require_platform_admin
from cluster import selectors, services
from cluster.models import Device, DeviceQuota, Job, JobEvent, Node
from cluster.scheduling import selectors as pool_selectors, services as pool_services


class DeviceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Device
        fields = ["index", "kind", "name", "uuid", "memory_bytes", "compute_tflops"]


class NodeSerializer(serializers.ModelSerializer):
    devices = DeviceSerializer(many=True, read_only=True)
    queue = serializers.CharField(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "name", "hostname", "address", "queue", "status",
                  "cpu_cores", "memory_bytes", "last_heartbeat_at",
                  "registered_at", "info", "devices"]


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["state", "message", "at"]


class QueuePlaceSerializer(serializers.Serializer):
    """Where a queued item stands in its line: the same shape for documents, evaluations and jobs."""

    position = serializers.IntegerField(help_text="1: next to start")
    ahead_in_your_workspace = serializers.IntegerField()
    estimated_start_s = serializers.FloatField(allow_null=True)
    reason = serializers.CharField()


class JobSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    events = JobEventSerializer(many=True, read_only=True)
    queue = serializers.SerializerMethodField(help_text="Where a queued job stands in its node's line.")

    class Meta:
        model = Job
        fields = ["id", "kind", "node", "state", "queue", "progress", "payload", "result", "error",
                  "celery_task_id", "worker", "created_at", "started_at", "finished_at", "events"]

    @extend_schema_field(QueuePlaceSerializer(allow_null=True))
    def get_queue(self, job) -> dict | None:
        lines = self.context.setdefault("node_lines", {})
        if job.node_id not in lines:
            lines[job.node_id] = services.job_line(job.node)
        place = services.job_place(lines[job.node_id], job)
        return place.as_dict() if place else None


class JobCreateSerializer(serializers.Serializer):
    kind = serializers.CharField()
    node = serializers.SlugRelatedField(slug_field="name", queryset=Node.objects.all())
    payload = serializers.JSONField(required=False, default=dict)


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """The GPU pool: every node, its devices and its health. Shared by all workspaces."""

    queryset = selectors.nodes()
    serializer_class = NodeSerializer
    permission_classes = [IsAuthenticated]
    lookup_field = "name"


class JobViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs dispatched to nodes by this workspace, with every state transition. Only kinds that act on no other
    app's objects can be submitted here (`node.inventory`); replicas start and stop through their deployment."""

    queryset = Job.objects.select_related("node").prefetch_related("events")
    serializer_class = JobSerializer

    @extend_schema(request=JobCreateSerializer, responses={201: JobSerializer})
    def create(self, request):
        data = JobCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.submit_job(actor=self.actor, workspace=self.workspace, **data.validated_data)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return Response(JobSerializer(services.cancel_job(actor=self.actor, job=self.get_object())).data)


class PoolView(APIView):
    """The shared pool: devices by node and state, queues with quota / in use / borrowed / lent, this workspace's
    jobs with why each waits, and device-hours (a platform administrator sees every workspace)."""

    permission_classes = [WorkspaceRole]

    @extend_schema(responses={200: dict})
    def get(self, request):
        return Response(pool_selectors.pool_view(workspace=request_workspace(request),
                                                 everything=is_platform_admin(request_actor(request))))


class QuotaSerializer(serializers.ModelSerializer):
    workspace = serializers.SlugRelatedField(slug_field="slug", queryset=Workspace.objects.all())
    nominal = serializers.IntegerField()
    borrowing_limit = serializers.IntegerField(allow_null=True, required=False, default=None)
    lending_limit = serializers.IntegerField(allow_null=True, required=False, default=None)

    class Meta:
        model = DeviceQuota
        fields = ["workspace", "device_kind", "nominal", "borrowing_limit", "lending_limit", "updated_at"]
        read_only_fields = ["updated_at"]
        validators = []  # a second POST for the same workspace and kind updates it


class QuotaViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Each workspace's queue per device kind (platform administrators): POST sets one (creates or updates);
    running work is never stopped by a change, only reclaimed at checkpoints when others need the devices."""

    queryset = DeviceQuota.objects.select_related("workspace")
    serializer_class = QuotaSerializer
    permission_classes = [IsAuthenticated]

    def get_queryset(self):
        require_platform_admin(actor=request_actor(self.request), action="Reading the pool's quotas")
        return super().get_queryset()

    @extend_schema(request=QuotaSerializer, responses={200: QuotaSerializer})
    def create(self, request):
        data = QuotaSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        quota = pool_services.set_quota(actor=request_actor(request), **data.validated_data)
        return Response(QuotaSerializer(quota).data)
