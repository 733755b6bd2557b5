from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.i18n import JavaScriptCatalog
from rest_framework.routers import SimpleRouter

from accounts import api, views

router = SimpleRouter()
router.register("workspaces", api.WorkspaceViewSet, basename="workspace")
router.register("members", api.MemberViewSet, basename="member")
router.register("keys", api.ApiKeyViewSet, basename="api-key")
router.register("audit", api.AuditViewSet, basename="audit")

api_urlpatterns = [
    path("auth/login/", api.LoginView.as_view(), name="api-login"),
    path("auth/logout/", api.LogoutView.as_view(), name="api-logout"),
    path("auth/me/", api.MeView.as_view(), name="api-me"),
    *router.urls,
]

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("language/", views.choose_language, name="choose-language"),
    # gettext() for static/js, from locale/*/LC_MESSAGES/djangojs.po.
    path("jsi18n/", JavaScriptCatalog.as_view(), name="javascript-catalog"),
    path("workspaces/switch/", views.switch_workspace, name="switch-workspace"),
    path("workspaces/new/", views.create_workspace, name="create-workspace"),
    path("keys/", views.api_keys, name="api-keys"),
    path("keys/<int:key_id>/revoke/", views.revoke_api_key, name="revoke-api-key"),
    path("settings/", views.settings_page, name="settings"),
    path("settings/members/<int:membership_id>/remove/", views.remove_member, name="remove-member"),
]
