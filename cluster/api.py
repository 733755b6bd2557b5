from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from accounts.permissions import WorkspaceScopedMixin
from cluster import selectors, services
from cluster.models import Device, Job, JobEvent, Node


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
