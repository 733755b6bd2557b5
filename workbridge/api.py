from dataclasses import asdict

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.response import Response

from accounts.errors import NotFound, ValidationFailed
from accounts.permissions import WorkspaceScopedMixin
from workbridge import mcp_catalogue, selectors, services
from workbridge.models import ApiSpec, EgressRule, Invocation, McpServer, Secret, Tool
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
    spec_id = serializers.IntegerField(required=False, allow_null=True)
    mcp_server_id = serializers.IntegerField(required=False, allow_null=True)

    class Meta:
        model = Tool
        fields = ["id", "name", "description", "binding", "parameters", "output_schema", "config", "timeout_s",
                  "max_output_bytes", "spec_id", "mcp_server_id", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]
        # A tool is nothing without its argument schema and binding: a 400 naming them, not a 500 (fuzzing).
        extra_kwargs = {"parameters": {"required": True}, "config": {"required": True}}


def _in_workspace(model, pk, workspace):
    """The workspace's object with this id, or None for no id; another workspace's is a 404 like a missing one."""
    if pk is None:
        return None
    found = model.objects.filter(pk=pk, workspace=workspace).first()
    if found is None:
        raise NotFound(f"{model._meta.verbose_name.capitalize()} {pk} not found.")
    return found


class CurlSerializer(serializers.Serializer):
    command = serializers.CharField(max_length=100_000, trim_whitespace=False)
    name = serializers.CharField(required=False, default="", allow_blank=True)
    description = serializers.CharField(required=False, default="", allow_blank=True)
    preview = serializers.BooleanField(required=False, default=False)


def _draft_data(draft) -> dict:
    data = asdict(draft)
    data["secrets"] = sorted(draft.secrets)  # by name only: the values stay out of every answer
    return data


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
        fields = dict(data.validated_data)
        fields["spec"] = _in_workspace(ApiSpec, fields.pop("spec_id", None), self.workspace)
        fields["mcp_server"] = _in_workspace(McpServer, fields.pop("mcp_server_id", None), self.workspace)
        return services.save_tool(actor=self.actor, workspace=self.workspace, tool=tool, **fields)

    def create(self, request):
        return Response(ToolSerializer(self._save(request)).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None):
        return Response(ToolSerializer(self._save(request, self.get_object())).data)

    def perform_destroy(self, instance):
        services.delete_tool(actor=self.actor, tool=instance)

    @extend_schema(request=CurlSerializer, responses={201: ToolSerializer, 200: dict})
    @action(detail=False, methods=["post"], url_path="from-curl")
    def from_curl(self, request):
        """Make an http tool of one cURL command; credentials in it become workspace secrets. With
        `"preview": true` nothing is saved: the draft comes back (secrets by name only) to edit first."""
        data = CurlSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        if fields["preview"]:
            draft = services.preview_curl(actor=self.actor, workspace=self.workspace, command=fields["command"])
            return Response(_draft_data(draft))
        tool = services.import_curl(actor=self.actor, workspace=self.workspace, command=fields["command"],
                                    name=fields["name"], description=fields["description"])
        return Response(ToolSerializer(tool).data, status=status.HTTP_201_CREATED)

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


class ApiSpecSerializer(serializers.ModelSerializer):
    tools = serializers.SerializerMethodField()

    class Meta:
        model = ApiSpec
        fields = ["id", "title", "version", "source", "base_url", "tools", "created_at"]

    def get_tools(self, obj) -> list[dict]:
        return [{"id": tool.id, "name": tool.name, "operation": tool.config.get("operation", "")}
                for tool in obj.tools.all()]


class SpecSourceSerializer(serializers.Serializer):
    """The spec as an uploaded file, pasted text or a URL (one of them), and the API's base URL when the spec
    does not say it. A spec that does not validate is read leniently unless `strict`."""

    file = serializers.FileField(required=False)
    text = serializers.CharField(required=False, default="", allow_blank=True, trim_whitespace=False,
                                 max_length=services.SPEC_MAX_BYTES)
    url = serializers.CharField(required=False, default="", allow_blank=True, max_length=2000)
    base_url = serializers.CharField(required=False, default="", allow_blank=True, max_length=2000)
    strict = serializers.BooleanField(required=False, default=False,
                                      help_text="Refuse a spec that does not validate, instead of importing the "
                                                "operations that can be tools and listing what was repaired.")
    operations = serializers.ListField(child=serializers.DictField(), required=False, allow_null=True,
                                       default=None)

    def spec_source(self) -> dict:
        fields = dict(self.validated_data)
        upload = fields.pop("file", None)
        fields.pop("operations")
        fields["source"] = "pasted"
        if upload is not None:
            if upload.size > services.SPEC_MAX_BYTES:
                raise ValidationFailed(f"The spec file is larger than {services.SPEC_MAX_BYTES} bytes.",
                                       fields={"file": ["Too large."]})
            fields["text"] = upload.read().decode("utf-8", errors="replace")
            fields["source"] = f"upload: {upload.name}"[:2000]
        return fields


class ApiSpecViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Imported OpenAPI 3.x and Swagger 2.0 specs (JSON or YAML): `preview/` shows one draft tool per operation,
    the operations skipped and the problems repaired, each with its JSON path and reason; `POST` stores the spec and
    makes tools of the chosen operations. Deleting a spec deletes its tools."""

    serializer_class = ApiSpecSerializer
    queryset = ApiSpec.objects.prefetch_related("tools")
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    @extend_schema(request=SpecSourceSerializer, responses=dict)
    @action(detail=False, methods=["post"])
    def preview(self, request):
        data = SpecSourceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        preview = services.preview_spec(actor=self.actor, workspace=self.workspace, **data.spec_source())
        return Response({"title": preview.title, "version": preview.version,
                         "operations": [_draft_data(draft) for draft in preview.drafts],
                         "skipped": preview.skipped, "repaired": preview.repaired})

    @extend_schema(request=SpecSourceSerializer, responses={201: ApiSpecSerializer})
    def create(self, request):
        data = SpecSourceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = services.import_spec(actor=self.actor, workspace=self.workspace,
                                    operations=data.validated_data["operations"], **data.spec_source())
        return Response(ApiSpecSerializer(spec).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.delete_spec(actor=self.actor, spec=instance)


class McpServerSerializer(serializers.ModelSerializer):
    catalog_entry = serializers.CharField(required=False, allow_blank=True, max_length=64,
                                          help_text="A local server: the entry of the operator's command catalogue "
                                                    "(GET catalogue/).")
    arguments = serializers.ListField(child=serializers.CharField(), required=False,
                                      help_text="Extra arguments, each one the catalogue entry allows.")
    command = serializers.ListField(child=serializers.CharField(), required=False,
                                    help_text="A free-form local command: platform administrators, signed in, only.")

    class Meta:
        model = McpServer
        fields = ["id", "name", "transport", "url", "catalog_entry", "arguments", "command", "auth_secret",
                  "timeout_s", "disabled_reason", "created_at"]
        read_only_fields = ["id", "disabled_reason", "created_at"]


class CatalogueEntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    command = serializers.ListField(child=serializers.CharField())
    arguments = serializers.ListField(child=serializers.CharField(), help_text="Patterns extra arguments must match.")
    sandboxed = serializers.BooleanField()
    reason = serializers.CharField(help_text="Why an entry runs outside the sandbox.")
    installed = serializers.BooleanField(help_text="Whether its program is on this machine.")


class McpImportSerializer(serializers.Serializer):
    tools = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True, default=None)


class McpServerViewSet(WorkspaceScopedMixin, viewsets.ModelViewSet):
    """MCP servers whose tools the workspace uses: a streamable-HTTP URL (through the egress guard), or a local
    command from the operator's catalogue (`catalogue/`), which only admins may register. `tools/` lists what the
    server offers now; `import/` makes tools of them."""

    serializer_class = McpServerSerializer
    queryset = McpServer.objects.all()
    http_method_names = ["get", "post", "put", "delete"]

    def _save(self, request, server=None):
        data = McpServerSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return services.save_mcp_server(actor=self.actor, workspace=self.workspace, server=server,
                                        **data.validated_data)

    def create(self, request):
        return Response(McpServerSerializer(self._save(request)).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None):
        return Response(McpServerSerializer(self._save(request, self.get_object())).data)

    def perform_destroy(self, instance):
        services.delete_mcp_server(actor=self.actor, server=instance)

    @extend_schema(responses=CatalogueEntrySerializer(many=True))
    @action(detail=False, methods=["get"])
    def catalogue(self, request):
        """The local commands the operator offers every workspace (FACTORY_MCP_COMMANDS)."""
        try:
            offered = selectors.mcp_command_catalogue()
        except mcp_catalogue.CatalogueRefused as exc:
            raise ValidationFailed(str(exc))
        return Response(CatalogueEntrySerializer(offered, many=True).data)

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def tools(self, request, pk=None):
        server = self.get_object()
        offered = services.mcp_server_tools(actor=self.actor, server=server)
        imported = {tool.config.get("tool"): tool.name for tool in server.tools.all()}
        return Response([asdict(remote) | {"imported_as": imported.get(remote.name)} for remote in offered])

    @extend_schema(request=McpImportSerializer, responses=ToolSerializer(many=True))
    @action(detail=True, methods=["post"], url_path="import")
    def import_tools(self, request, pk=None):
        data = McpImportSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tools = services.import_mcp_tools(actor=self.actor, server=self.get_object(),
                                          names=data.validated_data["tools"])
        return Response(ToolSerializer(tools, many=True).data, status=status.HTTP_201_CREATED)
