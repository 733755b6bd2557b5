from drf_spectacular.utils import extend_schema
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


class JobSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    events = JobEventSerializer(many=True, read_only=True)

    class Meta:
        model = Job
        fields = ["id", "kind", "node", "state", "progress", "payload", "result", "error", "celery_task_id",
                  "worker", "created_at", "started_at", "finished_at", "events"]


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
