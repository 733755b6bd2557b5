from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"

    def ready(self) -> None:
        from runtime import bundles  # noqa: F401  registers the importer of app bundles
