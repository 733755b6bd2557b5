from django.urls import path
from rest_framework.routers import SimpleRouter

from runtime import api, app_api, views

router = SimpleRouter()
router.register("runtime/apps", api.AppViewSet, basename="app")

api_urlpatterns = [
    *router.urls,
    path("apps/<slug:slug>/chat", app_api.chat, name="app-chat"),
    path("apps/<slug:slug>/retrieve", app_api.retrieve, name="app-retrieve"),
    path("apps/<slug:slug>/feedback", app_api.feedback, name="app-feedback"),
    path("apps/<slug:slug>/v1/chat/completions", app_api.openai_chat_completions, name="app-openai-chat"),
    path("apps/<slug:slug>/v1/models", app_api.openai_models, name="app-openai-models"),
    path("apps/<slug:slug>/v1/<path:rest>", app_api.openai_unknown),
]

urlpatterns = [
    path("apps/", views.apps_page, name="apps"),
    path("apps/<slug:slug>/", views.app_page, name="app"),
    path("apps/<slug:slug>/export/", views.app_export, name="app-export"),
    path("apps/<slug:slug>/logs/", views.logs_page, name="app-logs"),
    path("apps/<slug:slug>/logs/<uuid:message_id>/", views.trace_page, name="app-trace"),
    path("apps/<slug:slug>/monitoring/", views.monitoring_page, name="app-monitoring"),
    path("apps/<slug:slug>/monitoring.json", views.monitoring_data, name="app-monitoring-data"),
    path("apps/<slug:slug>/widget", views.widget, name="app-widget"),
    path("apps/<slug:slug>/embed.js", views.embed_script, name="app-embed-script"),
]
