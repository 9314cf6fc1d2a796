"""The test suite: DEBUG off, fast hashing, a file SQLite database threads can share."""
from .base import *  # noqa: F401,F403
from .base import RUN_DIR, DATABASES

SECRET_KEY = "test-only-key-not-a-secret"
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so race tests' threads share one database through their own connections.
    DATABASES["default"]["TEST"] = {"NAME": str(RUN_DIR / "test.sqlite3")}
