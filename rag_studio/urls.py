from django.urls import path
from rest_framework.routers import SimpleRouter

from rag_studio import api, views

router = SimpleRouter()
router.register("rag/knowledge-bases", api.KnowledgeBaseViewSet, basename="knowledge-base")
router.register("rag/documents", api.DocumentViewSet, basename="rag-document")
router.register("rag/configs", api.RagConfigViewSet, basename="rag-config")
router.register("rag/eval-sets", api.EvalSetViewSet, basename="eval-set")
router.register("rag/eval-runs", api.EvalRunViewSet, basename="eval-run")
router.register("rag/tunings", api.TuningViewSet, basename="rag-tuning")
api_urlpatterns = router.urls

urlpatterns = [
    path("rag/", views.rag_home, name="rag"),
    path("rag/kb/<int:kb_id>/", views.kb_page, name="rag-kb"),
    path("rag/kb/<int:kb_id>/progress/", views.kb_progress, name="rag-kb-progress"),
    path("rag/kb/<int:kb_id>/upload/", views.kb_upload, name="rag-kb-upload"),
    path("rag/kb/<int:kb_id>/settings/", views.kb_settings, name="rag-kb-settings"),
    path("rag/kb/<int:kb_id>/hit-test/", views.hit_test, name="rag-hit-test"),
    path("rag/documents/<int:document_id>/", views.document_page, name="rag-document"),
    path("rag/documents/<int:document_id>/action/", views.document_action, name="rag-document-action"),
    path("rag/configs/new/", views.config_edit, name="rag-config-new"),
    path("rag/configs/<int:config_id>/", views.config_edit, name="rag-config"),
    path("rag/configs/<int:config_id>/chat/", views.config_chat, name="rag-config-chat"),
    path("rag/configs/<int:config_id>/export/", views.config_export, name="rag-config-export"),
    path("rag/configs/<int:config_id>/chat/stream", views.config_chat_stream, name="rag-config-chat-stream"),
    path("rag/evals/", views.evals_page, name="rag-evals"),
    path("rag/evals/runs/<int:run_id>/", views.eval_run_page, name="rag-eval-run"),
    path("rag/evals/tunings/<int:tuning_id>/", views.tuning_page, name="rag-tuning"),
]
