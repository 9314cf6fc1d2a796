#!/usr/bin/env python
import sys


def main():
    from django.core.exceptions import ImproperlyConfigured

    from config.entrypoints import require_settings_module

    try:
        require_settings_module("manage.py")
    except ImproperlyConfigured as exc:
        sys.exit(f"manage.py: {exc}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
