from django.apps import AppConfig


class EventbusConfig(AppConfig):
    name = "eventbus"
