"""manage.py engine_env: the engine families' own virtualenvs (deployments/engine_envs.py)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments import engine_envs


class Command(BaseCommand):
    help = "List the engine families' environments, or install one (before a first start)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "install", "python"])
        parser.add_argument("family", nargs="?", help="an engine family (see list)")

    def handle(self, *args: Any, **options: Any) -> None:
        family = options["family"]
        if options["action"] == "list":
            for name in engine_envs.families():
                state = "ready" if engine_envs.ready(name) else "not installed"
                self.stdout.write(f"{name}\t{state}\t{engine_envs.location(name)}")
            return
        if not family:
            raise CommandError(f"which family? ({', '.join(engine_envs.families())})")
        try:
            if options["action"] == "install":
                python = engine_envs.ensure(family, lambda line: self.stdout.write(line))
                self.stdout.write(f"{family}: ready ({python})")
            elif not engine_envs.ready(family):
                raise CommandError(f"{family}: not installed (manage.py engine_env install)")
            else:
                self.stdout.write(engine_envs.python(family))
        except engine_envs.EnvFailed as exc:
            raise CommandError(str(exc)) from exc
