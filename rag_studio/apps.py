from django.apps import AppConfig


class RagStudioConfig(AppConfig):
    name = "rag_studio"

    def ready(self) -> None:
        from rag_studio import (  # noqa: F401  register the bootstrap step and the bundle importer
            bootstrap,
            bundles,
            serving_prompts,  # noqa: F401  offer eval sets to model-group calibration
        )
