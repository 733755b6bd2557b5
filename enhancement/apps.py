from django.apps import AppConfig


class EnhancementConfig(AppConfig):
    name = "enhancement"

    def ready(self) -> None:
        from enhancement import files, jobs  # noqa: F401  jobs registers the cluster job handlers
        from enhancement.runner import PRODUCER
        from serving.services import register_model_producer

        # Serving registers the models a job exports only from inside this directory.
        register_model_producer(name=PRODUCER, directory=files.jobs_root())
