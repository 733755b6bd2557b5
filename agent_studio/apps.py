from django.apps import AppConfig


class AgentStudioConfig(AppConfig):
    name = "agent_studio"

    def ready(self) -> None:
        from agent_studio import serving_prompts  # noqa: F401  offer scenarios to model-group calibration
