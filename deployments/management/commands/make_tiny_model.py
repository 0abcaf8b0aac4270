"""manage.py make_tiny_model OUT [--kind chat|embedding|whisper] [--seed N]: a tiny model
made here, with no download: a llama GGUF for llama.cpp (deployments/tiny_model.py) or a
ggml Whisper for whisper.cpp (deployments/engines/whisper_ggml.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from deployments.engines import whisper_ggml
from deployments.tiny_model import write

KINDS = ("chat", "embedding", "whisper")


class Command(BaseCommand):
    help = "Write a tiny model of seeded random weights (llama GGUF, or ggml Whisper)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("out", type=Path)
        parser.add_argument("--kind", choices=KINDS, default="chat")
        parser.add_argument("--embedding", action="store_true", help="the same as --kind embedding")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--if-missing", action="store_true", help="leave an existing file as it is"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        out: Path = options["out"]
        if options["if_missing"] and out.exists():
            return
        kind = "embedding" if options["embedding"] else options["kind"]
        out.parent.mkdir(parents=True, exist_ok=True)
        if kind == "whisper":
            whisper_ggml.write_tiny(out, seed=options["seed"])
        else:
            write(out, seed=options["seed"], embedding=kind == "embedding")
        self.stdout.write(f"wrote a tiny {kind} model: {out} ({out.stat().st_size} bytes)")
