from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.permissions import WorkspaceScopedMixin
from workbridge import services
from workbridge.models import EgressRule, Invocation, Secret, Tool
from workbridge.vault import mask


class EgressRuleSerializer(serializers.ModelSerializer):
    class Meta:
        model = EgressRule
        fields = ["id", "entry", "note", "created_at"]
        read_only_fields = ["id", "created_at"]


class EgressRuleViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.DestroyModelMixin,
                        viewsets.GenericViewSet):
    """The workspace's egress allowlist: hosts (`api.corp.example`, `*.corp.example`) and networks (`10.1.0.0/16`)
    that its tools, specs, MCP servers and external models may reach though they are not public. Admins change it."""

    serializer_class = EgressRuleSerializer
    queryset = EgressRule.objects.all()

    @extend_schema(request=EgressRuleSerializer, responses={201: EgressRuleSerializer})
    def create(self, request):
        data = EgressRuleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rule = services.add_egress_rule(actor=self.actor, workspace=self.workspace, **data.validated_data)
        return Response(EgressRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.remove_egress_rule(actor=self.actor, rule=instance)


class ToolSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tool
        fields = ["id", "name", "description", "binding", "parameters", "config", "timeout_s", "max_output_bytes",
                  "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]


class InvokeSerializer(serializers.Serializer):
    arguments = serializers.JSONField(default=dict)


class InvocationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Invocation
        fields = ["id", "caller", "arguments", "status", "http_status", "latency_ms", "result_excerpt", "error",
                  "created_at"]


class SecretSerializer(serializers.ModelSerializer):
    value = serializers.CharField(write_only=True, trim_whitespace=False)
    masked = serializers.SerializerMethodField()

    class Meta:
        model = Secret
        fields = ["id", "name", "value", "masked", "updated_at"]
        read_only_fields = ["id", "updated_at"]

    def get_masked(self, obj) -> str:
        return mask(obj.value)


class ToolViewSet(WorkspaceScopedMixin, viewsets.ModelViewSet):
    """The workspace's tools. Each is a name and description for a model, a JSON Schema for its arguments and a
    binding; every change is a new version in the asset registry."""

    serializer_class = ToolSerializer
    queryset = Tool.objects.all()
    http_method_names = ["get", "post", "put", "delete"]

    def _save(self, request, tool=None):
        data = ToolSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return services.save_tool(actor=self.actor, workspace=self.workspace, tool=tool, **data.validated_data)

    def create(self, request):
        return Response(ToolSerializer(self._save(request)).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None):
        return Response(ToolSerializer(self._save(request, self.get_object())).data)

    def perform_destroy(self, instance):
        services.delete_tool(actor=self.actor, tool=instance)

    @extend_schema(request=InvokeSerializer, responses=dict)
    @action(detail=True, methods=["post"])
    def invoke(self, request, pk=None):
        """Call the tool with `arguments`: the request sent (secrets masked), the output, status and latency."""
        data = InvokeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = services.invoke_tool(actor=self.actor, tool=self.get_object(),
                                      arguments=data.validated_data["arguments"], caller="api")
        return Response({"invocation": InvocationSerializer(result.invocation).data, "request": result.request,
                         "output": result.output})

    @extend_schema(parameters=[OpenApiParameter("status", str)], responses=InvocationSerializer(many=True))
    @action(detail=True, methods=["get"])
    def invocations(self, request, pk=None):
        """The tool's calls, newest first; `?status=failed` for the failed ones."""
        calls = self.get_object().invocations.all()
        if request.query_params.get("status"):
            calls = calls.filter(status=request.query_params["status"])
        page = self.paginate_queryset(calls)
        return self.get_paginated_response(InvocationSerializer(page, many=True).data)


class SecretViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Credentials tools send, by name. Encrypted at rest; after saving only a masked form is ever shown."""

    serializer_class = SecretSerializer
    queryset = Secret.objects.all()

    @extend_schema(request=SecretSerializer, responses={201: SecretSerializer})
    def create(self, request):
        data = SecretSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        secret = services.set_secret(actor=self.actor, workspace=self.workspace, **data.validated_data)
        return Response(SecretSerializer(secret).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.delete_secret(actor=self.actor, secret=instance)
