"""The tiny models the suite makes (`manage.py make_tiny_model`), made once per machine: kept
beside the engine environments (MSHIP_ENGINE_ENVS_DIR/../test-models), named by their kind,
seed and a digest of the code that makes them, so that a change to a maker makes its models
anew. Making stable-diffusion.cpp's 2 GB of random weights took 36 s of every run, vLLM's
tiny Llama 12 s. Each is made into a temporary folder and renamed into place under a lock:
two workers or two runs side by side make it once, and a run killed midway leaves nothing a
later one takes for whole. The engines only read them; a test that changes a model makes
its own copy."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from django.core.management import call_command

from deployments import engine_envs

REPO = Path(__file__).resolve().parent.parent
# What decides a made model's bytes: the command and every maker it runs.
MAKERS = (
    "deployments/management/commands/make_tiny_model.py",
    "deployments/tiny_model.py",
    "deployments/engines/whisper_ggml.py",
    "deployments/engines/tiny_diffusers.py",
    "deployments/engines/sd15_random.py",
    "deployments/engines/tiny_hf_llama.py",
    "deployments/engines/tiny_hf_lora.py",
    "deployments/engines/tiny_hf_whisper.py",
    "deployments/engines/tiny_whisper_ct2.py",
)


def makers_digest() -> str:
    digest = hashlib.sha256()
    for name in MAKERS:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    return engine_envs.root().parent / "test-models"


def made(kind: str, seed: int = 0, name: str = "model") -> Path:
    """The model `make_tiny_model OUT --kind KIND --seed SEED` writes, as `name` (a file or
    a folder, as the kind makes it), made here where this machine has none yet."""
    folder = cache_root() / f"{kind}-seed{seed}-{makers_digest()}"
    target = folder / name
    if target.exists():
        return target
    folder.parent.mkdir(parents=True, exist_ok=True)
    with engine_envs.locked(folder):
        if target.exists():  # made by another worker while this one waited
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=folder.parent))
        try:
            call_command(
                "make_tiny_model", str(scratch / name), "--kind", kind, "--seed", str(seed)
            )
            folder.mkdir(exist_ok=True)
            (scratch / name).rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target
