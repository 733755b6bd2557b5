from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"

    def ready(self) -> None:
        from serving import bootstrap, services  # noqa: F401  register the bootstrap step and job handlers
