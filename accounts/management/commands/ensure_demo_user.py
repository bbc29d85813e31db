import os
import secrets
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from accounts.models import User


class Command(BaseCommand):
    help = "Create the demo superuser once (DJANGO_SUPERUSER_USERNAME / _PASSWORD win) and print how to sign in."

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "demo")
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD") or self.stored_password()
        user, created = User.objects.get_or_create(
            username=username, defaults={"kind": User.Kind.HUMAN, "is_staff": True, "is_superuser": True}
        )
        if created or not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
        self.stdout.write(f"Sign in as {username} / {password}")

    @staticmethod
    def stored_password() -> str:
        """A demo password generated once into the data dir, so it stays the same across runs."""
        path = settings.DATA_DIR / "demo_password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(9))
            path.chmod(0o600)
        return path.read_text().strip()
