from django.apps import AppConfig


class WorkbridgeConfig(AppConfig):
    name = "workbridge"

    def ready(self):
        from workbridge import bootstrap  # noqa: F401  registers the bootstrap step
