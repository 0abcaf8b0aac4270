"""The rows behind /api's sign-in: each user's API token, kept as its SHA-256 digest, and the
failed sign-ins that throttle guessing (deployments/login_throttle.py).

Defined here and imported by deployments/models.py, so that Django registers them with the
app; they are the site's, not a deployment's.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """A user's /api token (`Authorization: Token …`). Only its digest is stored: a copy of
    the database, a backup or the admin's list signs nobody in. The token is shown once,
    when made (deployments/api/tokens.py); making another replaces it."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token"
    )
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the token, hex.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"API token of {self.user}"


class LoginFailure(models.Model):
    """One failed sign-in, counted against the user name tried and the client's address."""

    key = models.CharField(max_length=200, db_index=True, help_text="user:NAME or addr:ADDRESS")
    time = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.key} at {self.time:%Y-%m-%d %H:%M:%S}"
