from django.apps import AppConfig


class AssetsConfig(AppConfig):
    name = "assets"
