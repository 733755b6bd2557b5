from django.urls import path
from rest_framework.routers import SimpleRouter

from cluster import api, views

router = SimpleRouter()
router.register("cluster/nodes", api.NodeViewSet, basename="node")
router.register("cluster/jobs", api.JobViewSet, basename="job")
api_urlpatterns = router.urls

urlpatterns = [path("cluster/", views.pool, name="cluster")]
