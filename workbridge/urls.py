from rest_framework.routers import SimpleRouter

from workbridge import api

router = SimpleRouter()
router.register("workbridge/egress-rules", api.EgressRuleViewSet, basename="egress-rule")
router.register("workbridge/tools", api.ToolViewSet, basename="tool")
router.register("workbridge/secrets", api.SecretViewSet, basename="secret")

api_urlpatterns = [*router.urls]
