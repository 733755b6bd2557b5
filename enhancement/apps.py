from django.apps import AppConfig


class EnhancementConfig(AppConfig):
    name = "enhancement"

    def ready(self) -> None:
        from enhancement import jobs  # noqa: F401  registers the cluster job handlers
