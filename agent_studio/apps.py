from django.apps import AppConfig


class AgentStudioConfig(AppConfig):
    name = "agent_studio"
