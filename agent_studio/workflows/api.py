"""Workflows' REST API under /api/workflows/: CRUD with versions, validate, run (queued; follow it over SSE at
/api/workflows/runs/<run_id>/events/), a run with its per-node trace, cancel."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.permissions import WorkspaceScopedMixin
from agent_studio import streaming as agent_streaming
from agent_studio.workflows import selectors, services, streaming
from agent_studio.workflows.models import Workflow, WorkflowRun, WorkflowVersion
from agent_studio.workflows.runner import run_payload


class WorkflowSerializer(serializers.ModelSerializer):
    graph = serializers.JSONField()

    class Meta:
        model = Workflow
        fields = ["id", "name", "description", "graph", "version", "created_at", "updated_at"]
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


def run_detail(run: WorkflowRun) -> dict:
    return run_payload(run) | {"workflow": run.workflow_name, "version": run.version.number if run.version else None,
                               "caller": run.caller, "created_at": run.created_at,
                               "nodes": selectors.node_trace(run)}


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
        return agent_streaming.response(streaming.sse(run, after=request.query_params.get("after", "0")))

    @extend_schema(request=None, responses=dict)
    @action(detail=True, methods=["post"])
    def cancel(self, request, public_id=None):
        return Response(run_detail(services.cancel_run(actor=self.actor, run=self.get_object())))
