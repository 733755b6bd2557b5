from django.urls import path
from rest_framework.routers import SimpleRouter

from workbridge import api, views

router = SimpleRouter()
router.register("workbridge/egress-rules", api.EgressRuleViewSet, basename="egress-rule")
router.register("workbridge/tools", api.ToolViewSet, basename="tool")
router.register("workbridge/secrets", api.SecretViewSet, basename="secret")
router.register("workbridge/specs", api.ApiSpecViewSet, basename="api-spec")
router.register("workbridge/mcp-servers", api.McpServerViewSet, basename="mcp-server")

api_urlpatterns = [*router.urls]

urlpatterns = [
    path("tools/", views.tools_home, name="tools"),
    path("tools/new/<slug:binding>/", views.tool_new, name="tool-new"),
    path("tools/<int:tool_id>/", views.tool_page, name="tool"),
    path("tools/<int:tool_id>/try/", views.tool_try, name="tool-try"),
    path("tools/<int:tool_id>/delete/", views.tool_delete, name="tool-delete"),
    path("tools/import/openapi/", views.import_openapi, name="tools-import-openapi"),
    path("tools/import/curl/", views.import_curl, name="tools-import-curl"),
    path("tools/specs/<int:spec_id>/delete/", views.spec_delete, name="spec-delete"),
    path("tools/secrets/", views.secret_set, name="secret-set"),
    path("tools/secrets/<int:secret_id>/delete/", views.secret_delete, name="secret-delete"),
    path("tools/allowlist/", views.rule_add, name="egress-rule-add"),
    path("tools/allowlist/<int:rule_id>/delete/", views.rule_delete, name="egress-rule-delete"),
    path("tools/mcp/", views.mcp_server_add, name="mcp-server-add"),
    path("tools/mcp/<int:server_id>/", views.mcp_server_page, name="mcp-server"),
    path("tools/mcp/<int:server_id>/delete/", views.mcp_server_delete, name="mcp-server-delete"),
]
