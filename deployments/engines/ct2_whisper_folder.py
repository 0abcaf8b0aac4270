"""What a CTranslate2 Whisper folder must hold for faster-whisper to load it offline: checked by
the loader before a start (standard library only, so a Modelship process need not load the
engine's server) and by the engine itself."""

from __future__ import annotations

import os

# Without tokenizer.json faster-whisper would fetch OpenAI's from the Hugging Face Hub.
REQUIRED_FILES = ("model.bin", "config.json", "tokenizer.json")


def problems(folder: str) -> list[str]:
    """Why the folder is not a CTranslate2 Whisper faster-whisper can load offline."""
    if not os.path.isdir(folder):
        return [f"{folder} is not a folder (a CTranslate2 Whisper model is one)"]
    return [
        f"{name} is missing from {folder}"
        for name in REQUIRED_FILES
        if not os.path.isfile(os.path.join(folder, name))
    ]
