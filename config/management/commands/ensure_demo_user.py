"""Create the demo user of `make run` once and print its credentials: its password for the page
and its DRF token for the API (`Authorization: Token <key>`).

The password is generated on creation and kept in the git-ignored .run/ folder (mode 0700; the
file 0600 from its first byte), so that the repository holds no credentials and every run prints
the same ones. The token lives in the database (rest_framework.authtoken); it is created once and
the same one printed every time.

    python manage.py ensure_demo_user            # both, for the `make run` banner
    TOKEN=$(python manage.py ensure_demo_user --token)   # the token alone, for scripts
"""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from config.private_files import private_dir, write_private_file


class Command(BaseCommand):
    help = "Create the demo user and its API token (if missing) and print its credentials."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--token", action="store_true", help="Print only the API token.")

    def handle(self, *args, username, token, **options):
        secret_file = settings.RUN_DIR / f"{username}-password"
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None or not secret_file.exists():
            password = secrets.token_urlsafe(12)
            write_private_file(secret_file, password)
            user = user or User(username=username)
            user.set_password(password)
            user.save()
        else:
            # Kept from a run of an earlier version, which left the folder and the file readable.
            private_dir(settings.RUN_DIR)
            secret_file.chmod(0o600)
        password = secret_file.read_text().strip()
        key = Token.objects.get_or_create(user=user)[0].key
        if token:
            self.stdout.write(key)
            return
        self.stdout.write(f"  Demo user: {username} / {password}")
        self.stdout.write(f"  API token: {key}")
