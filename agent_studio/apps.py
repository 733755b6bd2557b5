from django.apps import AppConfig


class AgentStudioConfig(AppConfig):
    name = "agent_studio"

    def ready(self) -> None:
        # serving_prompts offers scenarios to model-group calibration; serving_uses names the agents that use a
        # deployment when serving refuses to delete it.
        from agent_studio import services, serving_prompts, serving_uses  # noqa: F401
        from agent_studio.workflows import services as workflow_services
        from cluster import queues

        queues.count_workload(services.active_evaluations)
        queues.count_workload(workflow_services.active_evaluations)
