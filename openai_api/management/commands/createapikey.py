"""manage.py createapikey NAME [--models a,b] [--rpm N]: prints the key once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from openai_api import keys


class Command(BaseCommand):
    help = "Make an API key for the /v1 gateway and print it (it is stored hashed only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--models", default="", help="comma-separated models it may use")
        parser.add_argument("--rpm", type=int, default=None, help="requests per minute")

    def handle(self, *args: Any, **options: Any) -> None:
        allowed = [m.strip() for m in options["models"].split(",") if m.strip()]
        _, secret = keys.issue(
            None, options["name"], allowed_models=allowed, requests_per_minute=options["rpm"]
        )
        self.stdout.write(secret)
