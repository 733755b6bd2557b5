from django.apps import AppConfig


class WorkbridgeConfig(AppConfig):
    name = "workbridge"
