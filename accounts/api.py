from django.contrib.auth import authenticate, login, logout
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import selectors, services
from accounts.errors import Unauthenticated
from accounts.models import ApiKey, AuditEntry, KeyScope, Membership, Role, Workspace
from accounts.permissions import WorkspaceScopedMixin, request_actor, request_workspace


class WorkspaceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Workspace
        fields = ["id", "name", "slug", "created_at"]
        read_only_fields = ["slug", "created_at"]


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "username", "role", "created_at"]


class MemberCreateSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices, default=Role.DEVELOPER)


class MemberRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class ApiKeySerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True)
    revoked = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = ["id", "name", "role", "scope", "prefix", "created_by", "created_at", "expires_at", "last_used_at",
                  "revoked_at", "revoked"]

    def get_revoked(self, obj) -> bool:
        return obj.revoked_at is not None


class ApiKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.DEVELOPER)
    scope = serializers.ChoiceField(choices=KeyScope.choices, default=KeyScope.WORKSPACE,
                                    help_text="`platform`: also a platform administrator's actions, each audited; "
                                              "made only by a platform administrator signed in.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class IssuedKeySerializer(ApiKeySerializer):
    key = serializers.CharField(help_text="The secret. It is shown this once and never again.")

    class Meta(ApiKeySerializer.Meta):
        fields = ApiKeySerializer.Meta.fields + ["key"]


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None, read_only=True)
    api_key = serializers.CharField(source="api_key.prefix", default=None, read_only=True)

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor", "api_key", "action", "target_type", "target_id", "detail", "ip"]


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"})


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    workspace = WorkspaceSerializer(allow_null=True)
    role = serializers.CharField(allow_null=True)


class LoginView(APIView):
    authentication_classes = []
    permission_classes = [AllowAny]

    @extend_schema(request=LoginSerializer, responses={200: MeSerializer})
    def post(self, request):
        data = LoginSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        username, ip = data.validated_data["username"], request.META.get("REMOTE_ADDR")
        services.check_sign_in_allowed(username=username, ip=ip)
        user = authenticate(request, **data.validated_data)
        if user is None:
            services.record_failed_sign_in(username=username, ip=ip)
            raise Unauthenticated("Wrong username or password.")
        login(request, user)
        return Response({"username": user.username})


class LogoutView(APIView):
    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        logout(request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    @extend_schema(responses=MeSerializer)
    def get(self, request):
        workspace = request_workspace(request)
        role = workspace and selectors.effective_role(
            user=request.user, api_key=request_actor(request).api_key, workspace=workspace)
        return Response(MeSerializer({"username": request.user.username, "workspace": workspace,
                                      "role": role}).data)


class WorkspaceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                       viewsets.GenericViewSet):
    """The workspaces you belong to. Creating one makes you its owner."""

    serializer_class = WorkspaceSerializer
    permission_classes = [IsAuthenticated]

    def get_queryset(self):
        return selectors.workspaces_for(user=self.request.user)

    def create(self, request):
        data = WorkspaceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        workspace = services.create_workspace(actor=request_actor(request), name=data.validated_data["name"])
        return Response(WorkspaceSerializer(workspace).data, status=status.HTTP_201_CREATED)


class MemberViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Members of the current workspace. Adding, changing and removing members needs the admin role."""

    queryset = Membership.objects.select_related("user", "workspace")
    serializer_class = MembershipSerializer
    write_role = Role.ADMIN

    @extend_schema(request=MemberCreateSerializer, responses={201: MembershipSerializer})
    def create(self, request):
        data = MemberCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.add_member(actor=self.actor, workspace=self.workspace, **data.validated_data)
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=MemberRoleSerializer, responses=MembershipSerializer)
    def partial_update(self, request, pk=None):
        data = MemberRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.change_member_role(actor=self.actor, membership=self.get_object(),
                                                 role=data.validated_data["role"])
        return Response(MembershipSerializer(membership).data)

    def destroy(self, request, pk=None):
        services.remove_member(actor=self.actor, membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApiKeyViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """API keys of the current workspace. The secret is returned once, at creation; only its hash is kept."""

    serializer_class = ApiKeySerializer

    def get_queryset(self):
        return selectors.api_keys_visible_to(user=self.request.user, workspace=self.workspace,
                                             role=self.request.workspace_role)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: IssuedKeySerializer})
    def create(self, request):
        data = ApiKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = services.create_api_key(actor=self.actor, workspace=self.workspace, **data.validated_data)
        body = ApiKeySerializer(issued.api_key).data | {"key": issued.secret}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        api_key = services.revoke_api_key(actor=self.actor, api_key=self.get_object())
        return Response(ApiKeySerializer(api_key).data)

    def destroy(self, request, pk=None):
        services.revoke_api_key(actor=self.actor, api_key=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Every change made in the current workspace, newest first. Needs the admin role."""

    queryset = AuditEntry.objects.select_related("actor", "api_key")
    serializer_class = AuditEntrySerializer
    read_role = Role.ADMIN

    def get_queryset(self):
        entries = super().get_queryset()
        action_name = self.request.query_params.get("action")
        return entries.filter(action=action_name) if action_name else entries

