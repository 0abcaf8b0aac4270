"""manage.py make_tiny_model OUT.gguf [--embedding] [--seed N]: a tiny llama GGUF made here,
for llama.cpp to serve with no download (see deployments/tiny_model.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from deployments.tiny_model import write


class Command(BaseCommand):
    help = "Write a tiny llama-architecture GGUF (seeded random weights, byte-level BPE)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("out", type=Path)
        parser.add_argument("--embedding", action="store_true", help="mean-pooled embeddings")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--if-missing", action="store_true", help="leave an existing file as it is"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        out: Path = options["out"]
        if options["if_missing"] and out.exists():
            return
        write(out, seed=options["seed"], embedding=options["embedding"])
        kind = "embedding" if options["embedding"] else "chat"
        self.stdout.write(f"wrote a tiny {kind} model: {out} ({out.stat().st_size} bytes)")
