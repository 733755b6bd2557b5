from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from serving import api, gateway, views

router = SimpleRouter()
router.register("serving/models", api.ModelViewSet, basename="model")
router.register("serving/deployments", api.DeploymentViewSet, basename="deployment")
api_urlpatterns = router.urls

gateway_urlpatterns = [
    path("chat/completions", gateway.chat_completions, name="gateway-chat"),
    path("completions", gateway.completions, name="gateway-completions"),
    path("embeddings", gateway.embeddings, name="gateway-embeddings"),
    path("models", gateway.list_models, name="gateway-models"),
    re_path(r"^(?P<rest>.*)$", gateway.unknown_route),
]

urlpatterns = [path("metrics", views.prometheus_metrics, name="metrics")]
