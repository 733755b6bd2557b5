from django.apps import AppConfig


class RagStudioConfig(AppConfig):
    name = "rag_studio"

    def ready(self) -> None:
        # Registers the bootstrap step and the bundle importer, offers eval sets to model-group calibration, and
        # names its uses of deployments and models when serving refuses to delete one.
        from cluster import queues
        from rag_studio import bootstrap, bundles, serving_prompts, serving_uses  # noqa: F401
        from rag_studio.evals import jobs

        queues.count_workload(jobs.active_in)
        # Backups carry the indexes that live outside the data dir and the Django tables (pgvector's).
        from assets.backup import register_part
        from rag_studio.search import index_backup

        register_part(index_backup.PART, index_backup.dump, index_backup.load)
