from rest_framework.routers import SimpleRouter

from workbridge import api

router = SimpleRouter()
router.register("workbridge/egress-rules", api.EgressRuleViewSet, basename="egress-rule")

api_urlpatterns = [*router.urls]
