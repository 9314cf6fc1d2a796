"""The benchmarks' own database: a SQLite file in the temporary directory, or a database created
on a PostgreSQL server and dropped at the end. Shared by bench/idempotency.py and bench/gateway.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from eventbus.redis.redaction import masked_url

POSTGRES_SCHEMES = ("postgres", "pgsql")


def conninfo(server_url: str) -> str:
    """libpq connection string for the database named in `server_url` (`postgres` when none)."""
    import psycopg.conninfo

    parts = urlsplit(server_url)
    return psycopg.conninfo.make_conninfo(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password or None,
        dbname=parts.path.lstrip("/") or "postgres",
    )


def pg_reachable(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(conninfo(url), connect_timeout=3):
            return True
    except Exception:
        return False


class BenchDatabase:
    """A database of the bench's own, named `name`: created by `create()`, dropped by `drop()`.

    PostgreSQL when DATABASE_URL is a PostgreSQL URL, or, with DATABASE_URL unset, when
    `default_server` is given and answers; else a SQLite file, and `warning` says why when
    PostgreSQL was asked for or expected. `url` is the database's URL (for PostgreSQL, once
    created), `version` the server's ("PostgreSQL 16.2", "SQLite 3.45.1").
    """

    def __init__(self, name: str, default_server: str | None = None):
        self.name = name
        url = os.environ.get("DATABASE_URL", "")
        self.warning: str | None = None
        self.server_url: str | None = None
        if url.startswith(POSTGRES_SCHEMES):
            self.server_url = url
        elif not url and default_server and pg_reachable(default_server):
            self.server_url = default_server
        elif url:
            self.warning = f"DATABASE_URL={masked_url(url)} is not PostgreSQL: the bench runs on SQLite"
        elif default_server:
            self.warning = (
                f"no DATABASE_URL and no PostgreSQL at {masked_url(default_server)}: the bench runs on SQLite"
            )
        self.vendor = "postgresql" if self.server_url else "sqlite"
        if self.vendor == "sqlite":
            self.path = Path(tempfile.gettempdir()) / f"{self.name}.sqlite3"
            self.url = f"sqlite:///{self.path}"
            self.version = "SQLite " + __import__("sqlite3").sqlite_version
        self.created = False

    @property
    def postgres_url(self) -> str:
        assert self.server_url is not None, "not a PostgreSQL bench database"
        return self.server_url

    def create(self) -> None:
        if self.vendor == "postgresql":
            import psycopg

            with psycopg.connect(conninfo(self.postgres_url), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}"')
                conn.execute(f'CREATE DATABASE "{self.name}"')
                row = conn.execute("SHOW server_version").fetchone()
                assert row is not None
                self.version = "PostgreSQL " + row[0]
            self.url = urlunsplit(urlsplit(self.postgres_url)._replace(path="/" + self.name))
        self.created = True

    def backend_pids(self) -> list[int]:
        """The PostgreSQL server processes serving the bench database (the server's persistent
        connections), when the server runs on this machine."""
        import psycopg

        with psycopg.connect(conninfo(self.postgres_url), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            ).fetchall()
        return [pid for (pid,) in rows if Path(f"/proc/{pid}").exists()]

    def drop(self) -> None:
        if not self.created:
            return
        self.created = False
        if self.vendor == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
            return
        import psycopg

        with psycopg.connect(conninfo(self.postgres_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
