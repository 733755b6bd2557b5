from django.apps import AppConfig


class AgentStudioConfig(AppConfig):
    name = "agent_studio"

    def ready(self) -> None:
        # serving_prompts offers scenarios to model-group calibration.
        from agent_studio import services, serving_prompts  # noqa: F401
        from cluster import queues

        queues.count_workload(services.active_evaluations)
