"""Make sure an admin login exists and say how to sign in (make run).

The password and the admin's API token are kept in the var folder, readable by their owner
only, and printed only by the run that made them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import IntegrityError, transaction
from django.utils.crypto import get_random_string

from common.secret_files import write_secret
from deployments.api.tokens import issue_token
from deployments.auth_models import ApiToken


def password_file() -> Path:
    return Path(settings.VAR_DIR) / "admin_password"


def token_file() -> Path:
    return Path(settings.VAR_DIR) / "admin_token"


@dataclass(frozen=True)
class AdminLogin:
    username: str
    password: str | None  # only when this call made the login
    token: str | None  # only when this call made the token


def ensure_admin(username: str = "admin") -> AdminLogin:
    """The admin login, made when no superuser exists; its /api token, made when the
    admin has none (kept in var/admin_token for scripts)."""
    users = get_user_model()
    password = None
    if not users.objects.filter(is_superuser=True).exists():
        password = get_random_string(20)
        try:
            with transaction.atomic():
                users.objects.create_superuser(username, f"{username}@localhost", password)
        except IntegrityError:
            password = None  # another host's serve, starting at the same moment, made it
        else:
            write_secret(password_file(), password)
    admin = users.objects.filter(username=username, is_superuser=True).first()
    token = None
    if admin is not None and not ApiToken.objects.filter(user=admin).exists():
        token = issue_token(admin)  # the database keeps only its digest: this file has it
        write_secret(token_file(), token)
    return AdminLogin(username, password, token)


class Command(BaseCommand):
    help = "Create the admin login when no superuser exists, and print how to sign in."

    def handle(self, *args: Any, **options: Any) -> None:
        login = ensure_admin()
        if login.password:
            self.stdout.write(
                f"Sign in at /admin/ as {login.username!r} with password {login.password!r}"
            )
        else:
            self.stdout.write("An admin login exists (python manage.py changepassword to reset).")
