from django.urls import path
from rest_framework.routers import SimpleRouter

from cluster import api, views

router = SimpleRouter()
router.register("cluster/nodes", api.NodeViewSet, basename="node")
router.register("cluster/jobs", api.JobViewSet, basename="job")
router.register("cluster/quotas", api.QuotaViewSet, basename="quota")
api_urlpatterns = [*router.urls, path("cluster/pool/", api.PoolView.as_view(), name="pool")]

urlpatterns = [path("cluster/", views.pool, name="cluster"),
               path("cluster/quotas", views.set_quota, name="cluster-set-quota")]
