"""Create the demo user of `make run` once and print its credentials.

The password is generated on creation and kept in the git-ignored .run/ folder, so that
the repository holds no credentials and every run prints the same ones.
"""
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the demo user (if missing) and print its credentials."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")

    def handle(self, *args, username, **options):
        secret_file = settings.RUN_DIR / f"{username}-password"
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None or not secret_file.exists():
            password = secrets.token_urlsafe(12)
            settings.RUN_DIR.mkdir(parents=True, exist_ok=True)
            secret_file.write_text(password)
            secret_file.chmod(0o600)
            user = user or User(username=username)
            user.set_password(password)
            user.save()
        password = secret_file.read_text().strip()
        self.stdout.write(f"  Demo user: {username} / {password}")
