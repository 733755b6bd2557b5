from django.urls import path
from rest_framework.routers import SimpleRouter

from runtime import api, app_api, views

router = SimpleRouter()
router.register("runtime/apps", api.AppViewSet, basename="app")

api_urlpatterns = [
    *router.urls,
    # The server sends /api/apps/ to app_api_asgi ahead of Django; these serve Django's test client and reverse().
    path("apps/<slug:slug>/chat", app_api.django_view, {"endpoint": "chat"}, name="app-chat"),
    path("apps/<slug:slug>/feedback", app_api.django_view, {"endpoint": "feedback"}, name="app-feedback"),
    path("apps/<slug:slug>/<path:endpoint>", app_api.django_view),
]

urlpatterns = [
    path("apps/", views.apps_page, name="apps"),
    path("new-app/", views.new_app, name="new-app"),
    path("new-app/rag/<int:config_id>/", views.new_app_indexing, name="new-app-indexing"),
    path("apps/<slug:slug>/", views.app_page, name="app"),
    path("apps/<slug:slug>/export/", views.app_export, name="app-export"),
    path("apps/<slug:slug>/logs/", views.logs_page, name="app-logs"),
    path("apps/<slug:slug>/logs/<uuid:message_id>/", views.trace_page, name="app-trace"),
    path("apps/<slug:slug>/monitoring/", views.monitoring_page, name="app-monitoring"),
    path("apps/<slug:slug>/monitoring.json", views.monitoring_data, name="app-monitoring-data"),
    path("apps/<slug:slug>/widget", views.widget, name="app-widget"),
    path("apps/<slug:slug>/embed.js", views.embed_script, name="app-embed-script"),
]
