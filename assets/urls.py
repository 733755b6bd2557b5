from django.urls import path
from rest_framework.routers import SimpleRouter

from assets import api, views

router = SimpleRouter()
router.register("assets", api.AssetViewSet, basename="asset")
api_urlpatterns = [
    path("assets/import/", api.BundleImportView.as_view(), name="api-asset-import"),
    path("assets/instance-key/", api.InstanceKeyView.as_view(), name="api-instance-key"),
    *router.urls,
]

urlpatterns = [
    path("assets/", views.assets_page, name="assets"),
    path("assets/import/", views.import_bundle, name="assets-import"),
]
