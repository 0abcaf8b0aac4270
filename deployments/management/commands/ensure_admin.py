"""Make sure an admin login exists and say how to sign in (make run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils.crypto import get_random_string


def password_file() -> Path:
    return Path(settings.VAR_DIR) / "admin_password"


def ensure_admin(username: str = "admin") -> tuple[str, str | None]:
    """(username, password or None when the admin was made elsewhere)."""
    users = get_user_model()
    pw_file = password_file()
    if users.objects.filter(is_superuser=True).exists():
        user = users.objects.filter(username=username).first()
        if user is not None and pw_file.exists():
            password = pw_file.read_text().strip()
            if user.check_password(password):
                return username, password
        return username, None
    password = get_random_string(20)
    users.objects.create_superuser(username, f"{username}@localhost", password)
    pw_file.parent.mkdir(parents=True, exist_ok=True)
    pw_file.write_text(password + "\n")
    pw_file.chmod(0o600)
    return username, password


class Command(BaseCommand):
    help = "Create the admin login when no superuser exists, and print how to sign in."

    def handle(self, *args: Any, **options: Any) -> None:
        username, password = ensure_admin()
        if password:
            self.stdout.write(f"Sign in at /admin/ as {username!r} with password {password!r}")
        else:
            self.stdout.write("An admin login exists (python manage.py changepassword to reset).")
