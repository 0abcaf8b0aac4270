"""Make a user's /api token and print it, once (the database keeps only its digest).

Replaces DRF's drf_create_token, which printed a token kept in clear. A new token replaces
the user's old one (`--keep` refuses instead), so a lost token is made anew, not read back.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments.api.tokens import issue_token
from deployments.auth_models import ApiToken


class Command(BaseCommand):
    help = "Make a user's /api token (replacing any it has) and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--keep", action="store_true", help="fail instead of replacing an existing token"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user {options['username']!r}.")
        if options["keep"] and ApiToken.objects.filter(user=user).exists():
            raise CommandError(f"{user} has a token already (leave out --keep to replace it).")
        self.stdout.write(issue_token(user))
