from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "cluster"

    def ready(self) -> None:
        from cluster import bootstrap  # noqa: F401  registers the bootstrap step
        from cluster.scheduling import metrics

        metrics.install()
