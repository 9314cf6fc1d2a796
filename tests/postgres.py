"""PostgreSQL faults for the tests: a backend killed as an administrator, a failover or a
crashed server would kill it."""

from __future__ import annotations

from django.db import connection


def admin_connection(dbname: str | None = None):
    """A psycopg connection (autocommit) of its own to the server Django's connection uses."""
    import psycopg

    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname=dbname or settings["NAME"],
        autocommit=True,
    )


def kill_own_backend() -> None:
    """pg_terminate_backend of this thread's Django connection, from another session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with admin_connection() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
