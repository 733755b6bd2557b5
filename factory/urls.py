from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

import accounts.urls
import agent_studio.urls
import assets.urls
import cluster.urls
import enhancement.urls
import rag_studio.urls
import runtime.urls
import serving.urls
import workbridge.urls
from factory import views

api_urlpatterns = [
    *accounts.urls.api_urlpatterns,
    *cluster.urls.api_urlpatterns,
    *assets.urls.api_urlpatterns,
    *serving.urls.api_urlpatterns,
    *workbridge.urls.api_urlpatterns,
    *rag_studio.urls.api_urlpatterns,
    *enhancement.urls.api_urlpatterns,
    *agent_studio.urls.api_urlpatterns,
    *runtime.urls.api_urlpatterns,
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # Unknown API paths answer in the API's JSON error format, whatever DEBUG says.
    re_path(r"^", views.api_not_found),
]

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard", permanent=False)),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("healthz", views.healthz, name="healthz"),
    path("api/", include(api_urlpatterns)),
    path("v1/", include(serving.urls.gateway_urlpatterns)),
    path("admin/", admin.site.urls),
    path("", include(accounts.urls.urlpatterns)),
    path("", include(cluster.urls.urlpatterns)),
    path("", include(assets.urls.urlpatterns)),
    path("", include(serving.urls.urlpatterns)),
    path("", include(workbridge.urls.urlpatterns)),
    path("", include(rag_studio.urls.urlpatterns)),
    path("", include(enhancement.urls.urlpatterns)),
    path("", include(agent_studio.urls.urlpatterns)),
    path("", include(runtime.urls.urlpatterns)),
]

handler404 = views.api_not_found
handler500 = views.server_error
