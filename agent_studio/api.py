"""Agent Studio's REST API under /api/agents/: agents and versions, runs (start, follow live over SSE, approve a
plan, cancel), conversation variables, scenarios and evaluations."""

import json

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.permissions import WorkspaceScopedMixin
from agent_studio import selectors, services, streaming
from agent_studio.models import Agent, AgentEvalRun, AgentRun, AgentThread, AgentVersion, Scenario
from agent_studio.runner import run_payload
from agent_studio.runs import streaming as run_streaming
from agent_studio.strategies import probe
from cluster import queues
from cluster.api import QueuePlaceSerializer


class AgentSerializer(serializers.ModelSerializer):
    settings = serializers.JSONField(required=False, default=dict)

    class Meta:
        model = Agent
        fields = ["id", "name", "description", "template", "settings", "version", "created_at", "updated_at"]
        read_only_fields = ["id", "version", "created_at", "updated_at"]


class AgentVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = AgentVersion
        fields = ["number", "settings", "checksum", "created_at"]


class TemplateSettingSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(choices=["string", "array", "object"])
    required = serializers.BooleanField()
    default = serializers.JSONField(allow_null=True)
    description = serializers.CharField()


class TemplateSerializer(serializers.Serializer):
    template = serializers.CharField()
    label = serializers.CharField()
    description = serializers.CharField()
    settings = TemplateSettingSerializer(many=True)


class RunRequestSerializer(serializers.Serializer):
    input = serializers.CharField(max_length=services.MAX_INPUT_CHARS, trim_whitespace=False)
    thread_id = serializers.CharField(required=False, allow_blank=True, default="")
    user = serializers.CharField(required=False, allow_blank=True, default="", max_length=128)
    version = serializers.IntegerField(required=False, allow_null=True, default=None)


class PlanSerializer(serializers.Serializer):
    plan = serializers.JSONField()


class VariableSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    value = serializers.JSONField(allow_null=True)


class ScenarioSerializer(serializers.ModelSerializer):
    class Meta:
        model = Scenario
        fields = ["id", "name", "input", "history", "checks", "expected_tools", "tools_in_order", "forbidden_tools",
                  "expected_memory", "created_at"]
        read_only_fields = ["id", "created_at"]


class EvalRequestSerializer(serializers.Serializer):
    version = serializers.IntegerField(required=False, allow_null=True, default=None)
    include_safety = serializers.BooleanField(required=False, default=True)


class EvalRunSerializer(serializers.ModelSerializer):
    agent = serializers.CharField(source="agent.name", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True)
    queue = serializers.SerializerMethodField(help_text="Where a queued evaluation stands in the interactive line.")

    class Meta:
        model = AgentEvalRun
        fields = ["id", "agent", "version", "status", "queue", "include_safety", "progress", "total", "scores",
                  "results", "error", "created_at", "finished_at"]

    @extend_schema_field(QueuePlaceSerializer(allow_null=True))
    def get_queue(self, evaluation) -> dict | None:
        line = self.context.get("interactive_line")
        if line is None:
            line = self.context["interactive_line"] = queues.interactive_line()
        place = services.evaluation_place(line, evaluation)
        return place.as_dict() if place else None


def list_or_create(request, *, listed, body: type[serializers.Serializer], reply: type[serializers.Serializer],
                   create, created_status: int) -> Response:
    """An action that lists on GET and creates on POST (an agent's or a workflow's scenarios and evaluations): GET
    answers `listed` through `reply`; POST checks the request with `body`, hands its fields to `create`, and
    answers what that made through `reply`, with `created_status`."""
    if request.method == "GET":
        return Response(reply(listed, many=True).data)
    data = body(data=request.data)
    data.is_valid(raise_exception=True)
    return Response(reply(create(data.validated_data)).data, status=created_status)


def _run_summary(run: AgentRun) -> dict:
    # A run kept after its agent was deleted has the agent's name and no version.
    return run_payload(run) | {"input": run.input, "agent": run.agent.name if run.agent else run.agent_name,
                               "version": run.version.number if run.version else None,
                               "caller": run.caller, "created_at": run.created_at}


def _run_detail(run: AgentRun) -> dict:
    return _run_summary(run) | {"steps": selectors.run_steps(run)}


class AgentViewSet(WorkspaceScopedMixin, viewsets.ModelViewSet):
    """Agents: a template (tool_calling, plan_execute, team) and its settings (agent_studio/config.py). Every save
    that changes the settings is a new version."""

    serializer_class = AgentSerializer
    queryset = Agent.objects.all()
    http_method_names = ["get", "post", "put", "delete"]

    def _save(self, request, agent=None):
        data = AgentSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return services.save_agent(actor=self.actor, workspace=self.workspace, agent=agent, **data.validated_data)

    def create(self, request):
        return Response(AgentSerializer(self._save(request)).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None):
        return Response(AgentSerializer(self._save(request, self.get_object())).data)

    @extend_schema(parameters=[OpenApiParameter(
        "runs", str, enum=list(services.RUN_CHOICES), required=True,
        description="What becomes of the agent's runs: 'keep' (they stay in the workspace, under the agent's name, "
                    "with their steps and answers) or 'delete'.")], responses={204: None})
    def destroy(self, request, pk=None):
        """Delete the agent with its versions, conversations, scenarios and evaluations; `?runs=keep|delete` says
        what becomes of its runs. 409 while a published app pins it."""
        services.delete_agent(actor=self.actor, agent=self.get_object(), runs=request.query_params.get("runs", ""))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=TemplateSerializer(many=True))
    @action(detail=False, methods=["get"], pagination_class=None)
    def templates(self, request):
        """The templates an agent is made from: what each does and the settings it takes, the same in every
        workspace."""
        return Response(TemplateSerializer(selectors.templates(), many=True).data)

    @extend_schema(responses=AgentVersionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def versions(self, request, pk=None):
        return Response(AgentVersionSerializer(self.get_object().versions.all(), many=True).data)

    @extend_schema(request=None, responses=dict)
    @action(detail=True, methods=["post"], url_path="suggest-strategy")
    def suggest_strategy(self, request, pk=None):
        """Try each tool-calling strategy once on the agent's model and suggest the first that calls a tool."""
        agent = self.get_object()
        services.require_developer(actor=self.actor, agent=agent)
        return Response(probe(workspace_id=agent.workspace_id, model=agent.settings["model"]))

    @extend_schema(request=RunRequestSerializer, responses={202: dict})
    @action(detail=True, methods=["get", "post"])
    def runs(self, request, pk=None):
        """POST queues one turn (`thread_id` continues a conversation) and answers 202 with the run; follow it at
        /api/agents/runs/<run_id>/events/. GET lists the agent's runs, newest first."""
        agent = self.get_object()
        if request.method == "GET":
            page = self.paginate_queryset(selectors.runs(workspace=self.workspace).filter(agent=agent))
            return self.get_paginated_response([run_payload(run) | {"input": run.input} for run in page])
        data = RunRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        version = services.agent_version(agent, fields["version"]) if fields["version"] else None
        run = services.start_run(actor=self.actor, agent=agent, input=fields["input"],
                                 thread_id=fields["thread_id"] or None, end_user=fields["user"], version=version,
                                 caller="api")
        return Response(_run_detail(run), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ScenarioSerializer, responses=ScenarioSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def scenarios(self, request, pk=None):
        agent = self.get_object()
        return list_or_create(request, listed=agent.scenarios.all(), body=ScenarioSerializer,
                              reply=ScenarioSerializer, created_status=status.HTTP_201_CREATED,
                              create=lambda fields: services.save_scenario(actor=self.actor, agent=agent, **fields))

    @extend_schema(request=EvalRequestSerializer, responses=EvalRunSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def evaluations(self, request, pk=None):
        """POST scores a version (the latest by default) on the scenarios and the safety probes, in a worker."""
        agent = self.get_object()
        return list_or_create(request, listed=agent.eval_runs.select_related("version", "agent"),
                              body=EvalRequestSerializer, reply=EvalRunSerializer,
                              created_status=status.HTTP_202_ACCEPTED,
                              create=lambda fields: services.start_evaluation(
                                  actor=self.actor, agent=agent, version_number=fields["version"],
                                  include_safety=fields["include_safety"]))


class _InWorkspace(WorkspaceScopedMixin):
    selector = None

    def get_queryset(self):
        return type(self).selector(workspace=self.workspace)


class RunViewSet(_InWorkspace, viewsets.GenericViewSet):
    """One run by its id: its steps, its live events (SSE), plan approval and cancellation."""

    selector = staticmethod(selectors.runs)
    lookup_field = "public_id"
    serializer_class = PlanSerializer

    @extend_schema(operation_id="agents_runs_list", responses=dict)
    def list(self, request):
        """The workspace's runs, newest first: every agent's, and those kept when their agent was deleted."""
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([_run_summary(run) for run in page])

    @extend_schema(responses=dict)
    def retrieve(self, request, public_id=None):
        return Response(_run_detail(self.get_object()))

    @extend_schema(responses={(200, "text/event-stream"): str})
    @action(detail=True, methods=["get"])
    def events(self, request, public_id=None):
        """Server-sent events: status, step…, then plan (awaiting approval), done, error or cancelled."""
        run = self.get_object()
        return run_streaming.response(streaming.sse(run, after=request.query_params.get("after", "0")))

    @extend_schema(request=PlanSerializer, responses={202: dict})
    @action(detail=True, methods=["post"])
    def approve(self, request, public_id=None):
        """Resume a run paused on its plan, with the plan as edited: `{"plan": ["step", ...]}`."""
        data = PlanSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        run = services.approve_plan(actor=self.actor, run=self.get_object(), plan=data.validated_data["plan"])
        return Response(_run_detail(run), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses=dict)
    @action(detail=True, methods=["post"])
    def cancel(self, request, public_id=None):
        return Response(_run_detail(services.cancel_run(actor=self.actor, run=self.get_object())))


class ThreadViewSet(_InWorkspace, viewsets.GenericViewSet):
    """A conversation's memory variables, as it sees them (its own, its end user's and the agent's)."""

    selector = staticmethod(selectors.threads)
    lookup_field = "public_id"
    serializer_class = VariableSerializer

    @extend_schema(request=VariableSerializer, responses=dict)
    @action(detail=True, methods=["get", "put"])
    def variables(self, request, public_id=None):
        thread: AgentThread = self.get_object()
        if request.method == "PUT":
            data = VariableSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            services.set_thread_variable(actor=self.actor, thread=thread, **data.validated_data)
        return Response(selectors.thread_variables(thread))


class ScenarioViewSet(_InWorkspace, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    selector = staticmethod(selectors.scenarios)
    serializer_class = ScenarioSerializer
    http_method_names = ["get", "put", "delete"]

    def update(self, request, pk=None):
        scenario = self.get_object()
        data = ScenarioSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        scenario = services.save_scenario(actor=self.actor, agent=scenario.agent, scenario=scenario,
                                          **data.validated_data)
        return Response(ScenarioSerializer(scenario).data)

    def perform_destroy(self, instance):
        services.delete_scenario(actor=self.actor, scenario=instance)


class EvaluationViewSet(_InWorkspace, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    selector = staticmethod(selectors.eval_runs)
    serializer_class = EvalRunSerializer

    @extend_schema(request=None, responses=EvalRunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the evaluation; the results so far are kept."""
        return Response(EvalRunSerializer(services.cancel_evaluation(actor=self.actor,
                                                                     evaluation=self.get_object())).data)

    @extend_schema(responses={(200, "application/json"): dict})
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        """The whole evaluation as a JSON file: scores and every scenario's and probe's result."""
        evaluation = self.get_object()
        body = json.dumps(EvalRunSerializer(evaluation).data, ensure_ascii=False, indent=2, default=str)
        response = HttpResponse(body, content_type="application/json; charset=utf-8")
        response["Content-Disposition"] = (f'attachment; filename="{evaluation.agent.name}-v'
                                           f'{evaluation.version.number}-eval-{evaluation.pk}.json"')
        return response
