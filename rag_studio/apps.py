from django.apps import AppConfig


class RagStudioConfig(AppConfig):
    name = "rag_studio"

    def ready(self) -> None:
        # Registers the bootstrap step and the bundle importer, and offers eval sets to model-group calibration.
        from cluster import queues
        from rag_studio import bootstrap, bundles, serving_prompts  # noqa: F401
        from rag_studio.evals import jobs

        queues.count_workload(jobs.active_in)
