from django.urls import path
from rest_framework.routers import SimpleRouter

from agent_studio import api, views
from agent_studio.workflows import api as workflow_api, views as workflow_views

router = SimpleRouter()
router.register("agents/runs", api.RunViewSet, basename="agent-run")
router.register("agents/threads", api.ThreadViewSet, basename="agent-thread")
router.register("agents/scenarios", api.ScenarioViewSet, basename="agent-scenario")
router.register("agents/evaluations", api.EvaluationViewSet, basename="agent-evaluation")
router.register("agents", api.AgentViewSet, basename="agent")
router.register("workflows/runs", workflow_api.WorkflowRunViewSet, basename="workflow-run")
router.register("workflows/templates", workflow_api.WorkflowTemplateViewSet, basename="workflow-template")
router.register("workflows/evaluations", workflow_api.WorkflowEvaluationViewSet, basename="workflow-evaluation")
router.register("workflows", workflow_api.WorkflowViewSet, basename="workflow")

api_urlpatterns = [*router.urls]

urlpatterns = [
    path("agents/", views.agents_home, name="agents"),
    path("agents/<int:agent_id>/", views.agent_page, name="agent"),
    path("agents/<int:agent_id>/delete/", views.agent_delete, name="agent-delete"),
    path("agents/<int:agent_id>/chat/", views.agent_chat, name="agent-chat"),
    path("agents/<int:agent_id>/evaluation/", views.agent_evaluation, name="agent-evaluation"),
    path("agents/evaluations/<int:evaluation_id>/", views.evaluation_report, name="agent-evaluation-report"),
    path("agents/evaluations/<int:evaluation_id>/export/", views.evaluation_export, name="agent-evaluation-export"),
    path("agents/runs/<uuid:run_id>/", views.run_page, name="agent-run"),
    path("workflows/", workflow_views.workflows_home, name="workflows"),
    path("workflows/<int:workflow_id>/", workflow_views.workflow_canvas, name="workflow"),
    path("workflows/<int:workflow_id>/delete/", workflow_views.workflow_delete, name="workflow-delete"),
]
