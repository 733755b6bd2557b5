"""Workflows' REST API under /api/workflows/: CRUD with versions, validate, run (queued; follow it over SSE at
/api/workflows/runs/<run_id>/events/), a run with its per-node trace, cancel; the shipped templates (a workflow
made from one, with its scenario set); scenarios and evaluations (started, read, cancelled)."""

from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.errors import NotFound
from accounts.log_messages import as_text
from accounts.permissions import WorkspaceScopedMixin
from agent_studio.api import list_or_create
from agent_studio.runs import streaming as run_streaming
from agent_studio.workflows import catalog, selectors, services, streaming
from agent_studio.workflows.models import Workflow, WorkflowEvalRun, WorkflowRun, WorkflowScenario, WorkflowVersion
from agent_studio.workflows.runner import run_payload


class WorkflowSerializer(serializers.ModelSerializer):
    graph = serializers.JSONField()
    layout = serializers.JSONField(required=False, default=None,
                                   help_text='Where the canvas draws each node: {node id: {"x", "y"}}; no new version')

    class Meta:
        model = Workflow
        fields = ["id", "name", "description", "graph", "layout", "version", "created_at", "updated_at"]
        read_only_fields = ["id", "version", "created_at", "updated_at"]


class WorkflowVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = WorkflowVersion
        fields = ["number", "graph", "checksum", "created_at"]


class WorkflowGraphSerializer(serializers.Serializer):
    graph = serializers.JSONField()


class WorkflowRunRequestSerializer(serializers.Serializer):
    inputs = serializers.JSONField(required=False, default=dict)
    version = serializers.IntegerField(required=False, allow_null=True, default=None)


class WorkflowScenarioSerializer(serializers.ModelSerializer):
    inputs = serializers.JSONField()
    checks = serializers.JSONField(required=False, default=list)
    expected_nodes = serializers.JSONField(required=False, default=list)
    forbidden_nodes = serializers.JSONField(required=False, default=list)

    class Meta:
        model = WorkflowScenario
        fields = ["id", "name", "inputs", "checks", "expected_nodes", "forbidden_nodes", "created_at"]
        read_only_fields = ["id", "created_at"]


class WorkflowEvalRunSerializer(serializers.ModelSerializer):
    workflow = serializers.CharField(source="workflow.name", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True)

    class Meta:
        model = WorkflowEvalRun
        fields = ["id", "workflow", "version", "status", "include_safety", "progress", "total", "scores",
                  "results", "error", "created_at", "finished_at"]


class EvaluateSerializer(serializers.Serializer):
    version = serializers.IntegerField(required=False, allow_null=True, default=None)
    include_safety = serializers.BooleanField(required=False, default=True)


class FromTemplateSerializer(serializers.Serializer):
    template = serializers.CharField(help_text="A template's key, from GET /api/workflows/templates/")
    name = serializers.CharField(required=False, allow_blank=True, default="")
    bindings = serializers.JSONField(required=False, default=dict,
                                     help_text="slot: asset (a model's name, a knowledge base's or tool's id)")


def run_detail(run: WorkflowRun) -> dict:
    """The run with its nodes; each error as stored (English, as the worker wrote it) and as `error_text`, in the
    request's language."""
    nodes = [node | {"error_text": as_text(node["error"])} for node in selectors.node_trace(run)]
    return run_payload(run) | {"workflow": run.workflow_name, "version": run.version.number if run.version else None,
                               "caller": run.caller, "created_at": run.created_at, "error_text": as_text(run.error),
                               "nodes": nodes}


class WorkflowViewSet(WorkspaceScopedMixin, viewsets.ModelViewSet):
    """Workflows: a graph of nodes and edges with input variables (agent_studio/workflows/graph.py). Every save that
    changes the graph is a new version; a graph that could not run is a 400 naming the node."""

    serializer_class = WorkflowSerializer
    queryset = Workflow.objects.all()
    http_method_names = ["get", "post", "put", "delete"]

    def _save(self, request, workflow=None):
        data = WorkflowSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return services.save_workflow(actor=self.actor, workspace=self.workspace, workflow=workflow,
                                      **data.validated_data)

    def create(self, request):
        return Response(WorkflowSerializer(self._save(request)).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None):
        """Save the graph (a new version when it changed); a body with only `layout` moves the nodes on the
        canvas and keeps the version."""
        if isinstance(request.data, dict) and set(request.data) == {"layout"}:
            workflow = services.save_layout(actor=self.actor, workflow=self.get_object(),
                                            layout=request.data["layout"])
            return Response(WorkflowSerializer(workflow).data)
        return Response(WorkflowSerializer(self._save(request, self.get_object())).data)

    def destroy(self, request, pk=None):
        services.delete_workflow(actor=self.actor, workflow=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=WorkflowVersionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def versions(self, request, pk=None):
        return Response(WorkflowVersionSerializer(self.get_object().versions.all(), many=True).data)

    @extend_schema(request=WorkflowGraphSerializer, responses=dict)
    @action(detail=False, methods=["post"])
    def validate(self, request):
        """Check a graph without saving it: 200 with the graph as it would run, or a 400 naming the node."""
        data = WorkflowGraphSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        graph = services.validate(actor=self.actor, workspace=self.workspace, graph=data.validated_data["graph"])
        return Response({"valid": True, "graph": graph})

    @extend_schema(request=WorkflowRunRequestSerializer, responses={202: dict})
    @action(detail=True, methods=["get", "post"])
    def run(self, request, pk=None):
        """POST queues a run on `inputs` (the latest version, or `version`) and answers 202 with its run_id; GET
        lists the workflow's runs, newest first."""
        workflow = self.get_object()
        if request.method == "GET":
            page = self.paginate_queryset(selectors.runs(workspace=self.workspace).filter(workflow=workflow))
            return self.get_paginated_response([run_payload(run) for run in page])
        data = WorkflowRunRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        version = services.workflow_version(workflow, fields["version"]) if fields["version"] else None
        run = services.start_run(actor=self.actor, workflow=workflow, inputs=fields["inputs"], version=version)
        return Response(run_detail(run), status=status.HTTP_202_ACCEPTED)


    @extend_schema(methods=["get"], responses=WorkflowScenarioSerializer(many=True))
    @extend_schema(methods=["post"], request=WorkflowScenarioSerializer, responses={201: WorkflowScenarioSerializer})
    @action(detail=True, methods=["get", "post"])
    def scenarios(self, request, pk=None):
        """The cases the workflow's evaluation runs: inputs, checks on the answer (contains, not_contains, regex,
        json_field, judge), the nodes that must run and those that must not."""
        workflow = self.get_object()
        return list_or_create(request, listed=workflow.scenarios.all(), body=WorkflowScenarioSerializer,
                              reply=WorkflowScenarioSerializer, created_status=status.HTTP_201_CREATED,
                              create=lambda fields: services.save_scenario(actor=self.actor, workflow=workflow,
                                                                           **fields))

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["delete"], url_path=r"scenarios/(?P<scenario_id>\d+)")
    def delete_scenario(self, request, pk=None, scenario_id=None):
        scenario = self.get_object().scenarios.filter(pk=scenario_id).first()
        if scenario is None:
            raise NotFound(_("Scenario %(id)s not found for this workflow.") % {"id": scenario_id})
        services.delete_scenario(actor=self.actor, scenario=scenario)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(methods=["get"], responses=WorkflowEvalRunSerializer(many=True))
    @extend_schema(methods=["post"], request=EvaluateSerializer, responses={202: WorkflowEvalRunSerializer})
    @action(detail=True, methods=["get", "post"])
    def evaluations(self, request, pk=None):
        """POST scores a version (the latest unless `version`) on the scenarios and, for a chat-shaped workflow,
        the shipped safety probes; read the report at /api/workflows/evaluations/<id>/. GET lists them."""
        workflow = self.get_object()
        return list_or_create(request, listed=workflow.eval_runs.select_related("version"), body=EvaluateSerializer,
                              reply=WorkflowEvalRunSerializer, created_status=status.HTTP_202_ACCEPTED,
                              create=lambda fields: services.start_evaluation(
                                  actor=self.actor, workflow=workflow, version_number=fields["version"],
                                  include_safety=fields["include_safety"]))


class WorkflowTemplateViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet):
    """The workflow templates shipped with the platform; POST makes a workflow (with its scenario set) from one."""

    serializer_class = FromTemplateSerializer

    @extend_schema(operation_id="workflows_templates_list", responses=dict)
    def list(self, request):
        return Response(catalog.listing())

    @extend_schema(request=FromTemplateSerializer, responses={201: WorkflowSerializer})
    def create(self, request):
        data = FromTemplateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        workflow = catalog.create_from_template(actor=self.actor, workspace=self.workspace, key=fields["template"],
                                                name=fields["name"], bindings=fields["bindings"])
        return Response(WorkflowSerializer(workflow).data | {"scenarios": workflow.scenarios.count()},
                        status=status.HTTP_201_CREATED)


class WorkflowEvaluationViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet):
    """One workflow evaluation: its report (scores on the three axes, each scenario's and probe's result), cancel."""

    serializer_class = WorkflowEvalRunSerializer

    def get_queryset(self):
        return WorkflowEvalRun.objects.filter(workflow__workspace=self.workspace).select_related("workflow",
                                                                                                  "version")

    def retrieve(self, request, pk=None):
        return Response(WorkflowEvalRunSerializer(self.get_object()).data)

    @extend_schema(request=None, responses=WorkflowEvalRunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        evaluation = services.cancel_evaluation(actor=self.actor, evaluation=self.get_object())
        return Response(WorkflowEvalRunSerializer(evaluation).data)


class WorkflowRunViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet):
    """One workflow run by its id: its per-node trace, its live events (SSE), cancellation."""

    lookup_field = "public_id"
    serializer_class = serializers.Serializer

    def get_queryset(self):
        return selectors.runs(workspace=self.workspace)

    @extend_schema(operation_id="workflows_runs_list", responses=dict)
    def list(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([run_payload(run) | {"workflow": run.workflow_name} for run in page])

    @extend_schema(responses=dict)
    def retrieve(self, request, public_id=None):
        return Response(run_detail(self.get_object()))

    @extend_schema(responses={(200, "text/event-stream"): str})
    @action(detail=True, methods=["get"])
    def events(self, request, public_id=None):
        """Server-sent events: status, node (each node's start and record)…, then done, error or cancelled."""
        run = self.get_object()
        return run_streaming.response(streaming.sse(run, after=request.query_params.get("after", "0")))

    @extend_schema(request=None, responses=dict)
    @action(detail=True, methods=["post"])
    def cancel(self, request, public_id=None):
        return Response(run_detail(services.cancel_run(actor=self.actor, run=self.get_object())))
