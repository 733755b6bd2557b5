from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"

    def ready(self) -> None:
        from cluster import queues
        from serving import bootstrap, services  # noqa: F401  register the bootstrap step and job handlers
        from serving.groups import services as group_services

        queues.count_workload(group_services.active_calibrations)
