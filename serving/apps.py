from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"

    def ready(self) -> None:
        from cluster import queues
        from serving import bootstrap, services  # noqa: F401  register the bootstrap step and job handlers
        from serving.engines import embedding, external, llamacpp, vllm  # noqa: F401  each registers its engine
        from serving.groups import gateway, services as group_services  # noqa: F401  gateway registers its server

        queues.count_workload(group_services.active_calibrations)
