from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import WorkspaceRole, request_actor, request_workspace
from assets import bundles, selectors, signing
from assets.models import Asset, AssetKind, AssetVersion


class AssetVersionSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)

    class Meta:
        model = AssetVersion
        fields = ["number", "checksum", "summary", "created_at", "created_by"]


class AssetSerializer(serializers.ModelSerializer):
    versions = AssetVersionSerializer(many=True, read_only=True)

    class Meta:
        model = Asset
        fields = ["id", "kind", "ref_id", "name", "latest_version", "updated_at", "versions"]


class ImportedSerializer(serializers.Serializer):
    assets = AssetSerializer(many=True)
    notes = serializers.ListField(child=serializers.CharField())


class InstanceKeySerializer(serializers.Serializer):
    public_key = serializers.CharField(help_text="Add it to another instance's FACTORY_TRUSTED_BUNDLE_KEYS")
    fingerprint = serializers.CharField()


class AssetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The workspace's assets (knowledge bases, RAG configs, apps, agents, tools), each with its version history."""

    serializer_class = AssetSerializer
    permission_classes = [WorkspaceRole]

    def get_queryset(self):
        return selectors.assets(workspace=request_workspace(self.request), kind=self.request.query_params.get("kind"))

    @extend_schema(parameters=[OpenApiParameter("kind", enum=AssetKind.values, required=False)])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


class BundleImportView(APIView):
    """Import a signed bundle (multipart field `bundle`). It is verified first; a bundle that fails any check is
    refused with the reason, and nothing of it is imported."""

    permission_classes = [WorkspaceRole]
    parser_classes = [MultiPartParser]

    @extend_schema(request={"multipart/form-data": {"type": "object", "properties": {
        "bundle": {"type": "string", "format": "binary"}}, "required": ["bundle"]}},
        responses={201: ImportedSerializer})
    def post(self, request):
        upload = request.FILES.get("bundle")
        if upload is None:
            raise serializers.ValidationError({"bundle": ["Send the bundle as multipart field 'bundle'."]})
        outcome = bundles.import_bundle(actor=request_actor(request), workspace=request_workspace(request),
                                        file=upload)
        return Response(ImportedSerializer(outcome).data, status=status.HTTP_201_CREATED)


class InstanceKeyView(APIView):
    """This instance's bundle-signing public key."""

    permission_classes = [WorkspaceRole]

    @extend_schema(responses=InstanceKeySerializer)
    def get(self, request):
        return Response({"public_key": signing.instance_public_key(), "fingerprint": signing.instance_fingerprint()})
