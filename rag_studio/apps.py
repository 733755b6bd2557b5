from django.apps import AppConfig


class RagStudioConfig(AppConfig):
    name = "rag_studio"
