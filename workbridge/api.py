from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from accounts.permissions import WorkspaceScopedMixin
from workbridge import services
from workbridge.models import EgressRule


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
