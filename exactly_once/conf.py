"""The settings accessor every app builds its own on, after DRF's `api_settings`.

    from idempotency.conf import idempotency_settings
    idempotency_settings.TTL

Each app keeps its DEFAULTS and its accessor in its own `conf` module (idempotency.conf,
eventbus.conf, gateway.conf); the class lives here, in the shared core, so that no app imports
another for it. Defaults fill what the project leaves out, dotted paths in IMPORT_STRINGS are
imported, unknown keys are refused, and `override_settings` takes effect (the cache is dropped
on `setting_changed`).
"""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string


class AppSettings:
    def __init__(self, setting_name: str, defaults: dict, import_strings: tuple = ()):
        self.setting_name = setting_name
        self.defaults = defaults
        self.import_strings = import_strings
        self._cached: set[str] = set()
        setting_changed.connect(self._on_setting_changed, weak=False)

    @property
    def user_settings(self) -> dict:
        if not hasattr(self, "_user_settings"):
            user_settings = getattr(settings, self.setting_name, {}) or {}
            unknown = set(user_settings) - set(self.defaults)
            if unknown:
                raise ImproperlyConfigured(
                    f"{self.setting_name}: unknown key(s) {sorted(unknown)}; known: {sorted(self.defaults)}"
                )
            self._user_settings = user_settings
        return self._user_settings

    def __getattr__(self, attr: str):
        if attr.startswith("_") or attr not in self.defaults:
            raise AttributeError(f"Invalid {self.setting_name} setting: {attr!r}")
        value = self.user_settings.get(attr, self.defaults[attr])
        if attr in self.import_strings and isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"{self.setting_name}[{attr!r}]: cannot import {value!r}: {exc}"
                ) from exc
        self._cached.add(attr)
        setattr(self, attr, value)
        return value

    def reload(self) -> None:
        for attr in self._cached:
            delattr(self, attr)
        self._cached.clear()
        if hasattr(self, "_user_settings"):
            delattr(self, "_user_settings")

    def _on_setting_changed(self, *, setting, **kwargs):
        if setting == self.setting_name:
            self.reload()
