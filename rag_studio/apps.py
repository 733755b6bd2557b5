from django.apps import AppConfig


class RagStudioConfig(AppConfig):
    name = "rag_studio"

    def ready(self) -> None:
        # Registers the bootstrap step and the bundle importer, and offers eval sets to model-group calibration.
        from rag_studio import bootstrap, bundles, serving_prompts  # noqa: F401
