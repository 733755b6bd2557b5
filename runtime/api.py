"""Managing published apps over REST (/api/runtime/apps/): publish, re-publish, roll back, keys, web chat
settings, traces, feedback into eval sets, and monitoring. The apps' own public API is in app_api.py."""

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.errors import NotFound
from accounts.permissions import WorkspaceScopedMixin
from agent_studio import selectors as agent_selectors
from agent_studio.workflows import selectors as workflow_selectors
from assets.views import bundle_download
from rag_studio import selectors as rag_selectors
from runtime import selectors, services
from runtime.bundles import export_app_bundle
from runtime.models import App, AppKey, Feedback, Release, Trace


class ReleaseSerializer(serializers.ModelSerializer):
    config_version = serializers.IntegerField(source="config_version.number", default=None)
    agent_version = serializers.IntegerField(source="agent_version.number", default=None)
    workflow_version = serializers.IntegerField(source="workflow_version.number", default=None)
    published_by = serializers.CharField(source="published_by.username", default=None)

    class Meta:
        model = Release
        fields = ["number", "config_version", "agent_version", "workflow_version", "note", "published_by",
                  "published_at"]


class AppSerializer(serializers.ModelSerializer):
    rag_config = serializers.IntegerField(source="rag_config_id", read_only=True)
    agent = serializers.IntegerField(source="agent_id", read_only=True)
    workflow = serializers.IntegerField(source="workflow_id", read_only=True)
    release = ReleaseSerializer(source="current_release", read_only=True)
    calls = serializers.IntegerField(read_only=True)
    endpoints = serializers.SerializerMethodField()

    class Meta:
        model = App
        fields = ["id", "slug", "name", "rag_config", "agent", "workflow", "release", "enabled",
                  "default_rate_limit", "allowed_origins", "opener", "suggested_questions",
                  "widget_token", "calls", "endpoints", "created_at", "updated_at"]

    def get_endpoints(self, app) -> dict:
        base = f"/api/apps/{app.slug}"
        return {"chat": f"{base}/chat", "openai_base_url": f"{base}/v1", "retrieve": f"{base}/retrieve",
                "feedback": f"{base}/feedback", "widget": f"/apps/{app.slug}/widget",
                "embed_script": f"/apps/{app.slug}/embed.js"}


class PublishSerializer(serializers.Serializer):
    rag_config = serializers.IntegerField(required=False, allow_null=True, default=None)
    agent = serializers.IntegerField(required=False, allow_null=True, default=None,
                                     help_text="An agent to publish, instead of a RAG config")
    workflow = serializers.IntegerField(required=False, allow_null=True, default=None,
                                        help_text="A workflow to publish, instead of a RAG config or an agent")
    name = serializers.CharField(required=False, allow_blank=True, default="")
    slug = serializers.CharField(required=False, allow_blank=True, default="")
    rate_limit = serializers.IntegerField(required=False, default=60, help_text="Requests per minute per key")


class AppUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(required=False)
    enabled = serializers.BooleanField(required=False)
    rate_limit = serializers.IntegerField(required=False)
    allowed_origins = serializers.ListField(child=serializers.CharField(), required=False)
    opener = serializers.CharField(required=False, allow_blank=True, help_text="The web chat's greeting")
    suggested_questions = serializers.ListField(child=serializers.CharField(), required=False,
                                                help_text="Questions the web chat offers to ask in one click")


class AppKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = AppKey
        fields = ["id", "name", "prefix", "rate_limit", "created_at", "revoked_at", "last_used_at"]


class AppKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField()
    rate_limit = serializers.IntegerField(required=False, allow_null=True, default=None)


class FeedbackSerializer(serializers.ModelSerializer):
    rating = serializers.SerializerMethodField()

    class Meta:
        model = Feedback
        fields = ["rating", "comment", "eval_item", "created_at"]

    def get_rating(self, feedback) -> str:
        return "up" if feedback.rating > 0 else "down"


class TraceSerializer(serializers.ModelSerializer):
    message_id = serializers.UUIDField(source="public_id")
    release = serializers.IntegerField(source="release.number", default=None)
    conversation_id = serializers.UUIDField(source="conversation.public_id", default=None)
    feedback = FeedbackSerializer(default=None)
    workflow_run = serializers.UUIDField(source="workflow_run.public_id", default=None,
                                         help_text="A workflow app's run: GET /api/workflows/runs/<id>/ has its nodes")

    class Meta:
        model = Trace
        fields = ["id", "message_id", "release", "conversation_id", "channel", "end_user", "stream", "query",
                  "queries", "answer", "hits", "citations", "deployment", "model", "input_tokens", "output_tokens",
                  "retrieval_ms", "ttft_ms", "latency_ms", "status", "error", "feedback", "workflow_run",
                  "created_at"]


class FeedbackDatasetSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=96, required=False, allow_blank=True, default="",
                                 help_text="<slug>-feedback when blank; an existing name gets a new version")


class EvalItemFromFeedbackSerializer(serializers.Serializer):
    expected_answer = serializers.CharField()
    expected_sources = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True,
                                             default=None)
    eval_set = serializers.IntegerField(required=False, allow_null=True, default=None,
                                        help_text="Empty: the knowledge base's set of corrected answers")


class AppViewSet(WorkspaceScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                 viewsets.GenericViewSet):
    serializer_class = AppSerializer
    lookup_field = "slug"

    def get_queryset(self):
        return selectors.apps(workspace=self.workspace)

    def get_object(self) -> App:
        return selectors.app_by_slug(workspace=self.workspace, slug=self.kwargs["slug"])

    def _fresh(self, app: App) -> dict:
        return AppSerializer(selectors.app_by_slug(workspace=self.workspace, slug=app.slug)).data

    @extend_schema(request=PublishSerializer, responses={201: AppSerializer})
    def create(self, request):
        data = PublishSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        config = rag_selectors.scoped(rag_selectors.rag_configs(workspace=self.workspace), spec["rag_config"],
                                      "RAG config") if spec["rag_config"] is not None else None
        agent = None
        if spec["agent"] is not None:
            agent = agent_selectors.agents(workspace=self.workspace).filter(pk=spec["agent"]).first()
            if agent is None:
                raise NotFound(f"Agent {spec['agent']} not found.")
        workflow = None
        if spec["workflow"] is not None:
            workflow = workflow_selectors.workflows(workspace=self.workspace).filter(pk=spec["workflow"]).first()
            if workflow is None:
                raise NotFound(f"Workflow {spec['workflow']} not found.")
        app = services.publish_app(actor=self.actor, config=config, agent=agent, workflow=workflow,
                                   name=spec["name"],
                                   slug=spec["slug"], rate_limit=spec["rate_limit"])
        return Response(self._fresh(app), status=status.HTTP_201_CREATED)

    @extend_schema(request=AppUpdateSerializer, responses=AppSerializer)
    def partial_update(self, request, slug=None):
        data = AppUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        app = services.update_app(actor=self.actor, app=self.get_object(), **data.validated_data)
        return Response(self._fresh(app))

    def perform_destroy(self, instance):
        services.delete_app(actor=self.actor, app=instance)

    @extend_schema(request=None, responses=AppSerializer)
    @action(detail=True, methods=["post"])
    def publish(self, request, slug=None):
        """Serve the latest saved version of the RAG config or agent."""
        app = self.get_object()
        services.republish(actor=self.actor, app=app, note=str(request.data.get("note", "")))
        return Response(self._fresh(app))

    @extend_schema(responses=ReleaseSerializer(many=True))
    @action(detail=True, methods=["get"])
    def releases(self, request, slug=None):
        releases = self.get_object().releases.select_related("config_version", "agent_version", "workflow_version",
                                                             "published_by")
        return Response(ReleaseSerializer(releases, many=True).data)

    @extend_schema(request=None, responses=AppSerializer)
    @action(detail=True, methods=["post"], url_path=r"releases/(?P<number>\d+)/rollback")
    def rollback(self, request, slug=None, number=None):
        app = self.get_object()
        services.roll_back(actor=self.actor, app=app, number=int(number))
        return Response(self._fresh(app))

    @extend_schema(request=None, responses=AppSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-widget-token")
    def rotate_widget_token(self, request, slug=None):
        app = services.rotate_widget_token(actor=self.actor, app=self.get_object())
        return Response(self._fresh(app))

    @extend_schema(methods=["get"], responses=AppKeySerializer(many=True))
    @extend_schema(methods=["post"], request=AppKeyCreateSerializer, responses={201: AppKeySerializer})
    @action(detail=True, methods=["get", "post"])
    def keys(self, request, slug=None):
        """Create a key with POST: the secret is in the answer once and never again."""
        app = self.get_object()
        if request.method == "GET":
            return Response(AppKeySerializer(app.keys.all(), many=True).data)
        data = AppKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = services.create_app_key(actor=self.actor, app=app, **data.validated_data)
        return Response({**AppKeySerializer(issued.app_key).data, "secret": issued.secret},
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=AppKeySerializer)
    @action(detail=True, methods=["post"], url_path=r"keys/(?P<key_id>\d+)/revoke")
    def revoke_key(self, request, slug=None, key_id=None):
        app_key = self.get_object().keys.filter(pk=key_id).first()
        if app_key is None:
            raise NotFound(f"Key {key_id} not found for this app.")
        return Response(AppKeySerializer(services.revoke_app_key(actor=self.actor, app_key=app_key)).data)

    @extend_schema(parameters=[OpenApiParameter("feedback", str, enum=["up", "down", "any", "none"]),
                               OpenApiParameter("status", str, enum=["ok", "error", "cancelled"])],
                   responses=TraceSerializer(many=True))
    @action(detail=True, methods=["get"])
    def traces(self, request, slug=None):
        found = selectors.traces(app=self.get_object(), feedback=request.query_params.get("feedback", ""),
                                 status=request.query_params.get("status", "")).select_related("conversation")
        page = self.paginate_queryset(found)
        return Response(TraceSerializer(page if page is not None else found[:100], many=True).data)

    @extend_schema(request=EvalItemFromFeedbackSerializer, responses={201: None})
    @action(detail=True, methods=["post"], url_path=r"traces/(?P<message_id>[0-9a-f-]{36})/to-eval")
    def to_eval(self, request, slug=None, message_id=None):
        """Turn an answer's feedback into an eval item with the corrected answer."""
        app = self.get_object()
        feedback = Feedback.objects.filter(trace__app=app, trace__public_id=message_id).select_related(
            "trace__app__rag_config__knowledge_base").first()
        if feedback is None:
            raise NotFound(f"No feedback on message '{message_id}' of '{app.slug}'.")
        data = EvalItemFromFeedbackSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        spec = data.validated_data
        eval_set = rag_selectors.scoped(rag_selectors.eval_sets(workspace=self.workspace), spec["eval_set"],
                                        "Eval set") if spec["eval_set"] else None
        item = services.feedback_to_eval_item(actor=self.actor, feedback=feedback,
                                              expected_answer=spec["expected_answer"],
                                              expected_sources=spec["expected_sources"], eval_set=eval_set)
        return Response({"eval_set": item.eval_set_id, "eval_item": item.pk, "question": item.question,
                         "expected_answer": item.expected_answer, "expected_sources": item.expected_sources},
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=FeedbackDatasetSerializer, responses={201: dict})
    @action(detail=True, methods=["post"], url_path="feedback-dataset")
    def feedback_dataset(self, request, slug=None):
        """Export the app's up-voted answers (question and answer) as a fine-tuning dataset of this workspace."""
        data = FeedbackDatasetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        dataset = services.feedback_to_dataset(actor=self.actor, app=self.get_object(),
                                               name=data.validated_data["name"])
        return Response({"dataset": dataset.pk, "name": dataset.name, "sample_count": dataset.sample_count,
                         "page": reverse("enhancement-dataset", args=[dataset.pk])}, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("include_indexes", bool, required=False,
                                                description="Also bundle the chunks and vectors")],
                   responses={(200, "application/zip"): OpenApiTypes.BINARY})
    @action(detail=True, methods=["get"])
    def export(self, request, slug=None):
        """Download a signed bundle: the app's settings, the config version it serves, and its knowledge base.
        Import it on the Assets page (or POST /api/assets/import/) of any instance that trusts this one's key."""
        include_indexes = request.query_params.get("include_indexes", "") in ("1", "true", "on")
        exported = export_app_bundle(actor=self.actor, app=self.get_object(), include_indexes=include_indexes)
        return bundle_download(exported.path, exported.filename)

    @extend_schema(parameters=[OpenApiParameter("period", str, enum=list(selectors.PERIODS))], responses=dict)
    @action(detail=True, methods=["get"])
    def monitoring(self, request, slug=None):
        return Response(selectors.monitoring(app=self.get_object(), period=request.query_params.get("period", "24h")))
