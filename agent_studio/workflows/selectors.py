from django.db.models import QuerySet

from agent_studio.workflows.models import NodeRun, Workflow, WorkflowRun
from agent_studio.workflows.runner import node_payload


def workflows(*, workspace) -> QuerySet[Workflow]:
    return Workflow.objects.filter(workspace=workspace)


def runs(*, workspace) -> QuerySet[WorkflowRun]:
    return WorkflowRun.objects.filter(workspace=workspace).select_related("version")


def node_trace(run: WorkflowRun) -> list[dict]:
    return [node_payload(row) for row in NodeRun.objects.filter(run=run)]
