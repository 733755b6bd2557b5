from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from serving import api, gateway, views

router = SimpleRouter()
router.register("serving/models", api.ModelViewSet, basename="model")
router.register("serving/deployments", api.DeploymentViewSet, basename="deployment")
router.register("serving/requests", api.RequestRecordViewSet, basename="request-record")
router.register("serving/groups", api.ModelGroupViewSet, basename="model-group")
router.register("serving/calibrations", api.CalibrationRunViewSet, basename="calibration-run")
api_urlpatterns = router.urls

# The gateway routes its own paths (serving.gateway.dispatch), as its lean ASGI app does without Django.
gateway_urlpatterns = [re_path(r"^(?P<path>.*)$", gateway.gateway_view)]

urlpatterns = [
    path("metrics", views.prometheus_metrics, name="metrics"),
    path("serving/", views.serving_home, name="serving"),
    path("serving/models/<int:model_id>/deploy/", views.deploy_model, name="deploy-model"),
    path("serving/models/<int:model_id>/delete/", views.delete_model, name="delete-model"),
    path("serving/models/<int:model_id>/chat-template/", views.model_chat_template, name="model-chat-template"),
    path("serving/deployments/new/", views.create_deployment, name="create-deployment"),
    path("serving/deployments/<slug:name>/", views.deployment_page, name="deployment"),
    path("serving/deployments/<slug:name>/state/", views.deployment_state, name="deployment-state"),
    path("serving/groups/new/", views.create_model_group, name="create-model-group"),
    path("serving/groups/<slug:name>/", views.model_group_page, name="model-group"),
    path("serving/playground/", views.playground, name="playground"),
    path("serving/playground/chat", views.playground_chat, name="playground-chat"),
]
