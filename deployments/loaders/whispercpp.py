"""whisper.cpp: its `whisper-server` program where one is given (`binary`,
MSHIP_WHISPER_SERVER_BIN, on PATH, or in its image), else Modelship's own server on
`pywhispercpp` (deployments/engines/whisper_server.py) in the whisper engine environment,
which serves translations and every response format too."""

from __future__ import annotations

import os
import re
from typing import ClassVar

from deployments import estimate
from deployments.engines.whisper_ggml import problems
from deployments.loaders.base import (
    EngineSpec,
    extra_args_problems,
    whole_number_problems,
)
from deployments.loaders.shipped import ProgramOrShippedLoader


class WhisperCppLoader(ProgramOrShippedLoader):
    name = "whispercpp"
    config_key = "whispercpp_config"
    config_options: ClassVar[dict[str, str]] = {
        "threads": "CPU threads",
        "language": "the audio's language (ISO 639-1) when a request names none",
        "binary": "a whisper-server program to run (default: Modelship's own server)",
        "extra_args": "more whisper-server arguments, as a list of strings",
    }
    usecases = frozenset({"transcription", "translation"})
    module = "deployments.engines.whisper_server"
    family = "whisper"
    default_image = "ghcr.io/ggml-org/whisper.cpp:main"
    binary_name = "whisper-server"
    binary_env = "MSHIP_WHISPER_SERVER_BIN"
    # Decoding; not the address, the served paths (--public, --request-path), a VAD model
    # file or a temporary folder.
    operator_flags = frozenset(
        {
            "t", "threads", "p", "processors", "ot", "offset-t", "on", "offset-n", "d",
            "duration", "mc", "max-context", "ml", "max-len", "sow", "split-on-word", "bo",
            "best-of", "bs", "beam-size", "ac", "audio-ctx", "wt", "word-thold", "et",
            "entropy-thold", "lpt", "logprob-thold", "tr", "translate", "nf", "no-fallback",
            "nt", "no-timestamps", "l", "language", "dl", "detect-language", "prompt", "ng",
            "no-gpu", "fa", "flash-attn", "nfa", "no-flash-attn", "sns", "suppress-nst",
            "nth", "no-speech-thold", "no-context", "di", "diarize", "tdrz", "tinydiarize",
        }
    )  # fmt: skip

    def validate(self, spec: EngineSpec) -> list[str]:
        found = super().validate(spec)
        found += whole_number_problems(self, spec, "threads")
        found += extra_args_problems(self, spec)
        language = spec.config.get("language", "auto")
        if not (isinstance(language, str) and re.fullmatch(r"[a-z]{2,3}|auto", language)):
            found.append(f"{self.config_key}: language is an ISO 639-1 code (en) or auto")
        if self.program(spec) is None and os.path.isfile(spec.model):
            found += [f"model: {issue}" for issue in problems(spec.model)[:5]]
        return found

    def program_argv(self, binary: str, spec: EngineSpec, host: str, port: str) -> list[str]:
        cfg = spec.config
        argv = [binary, "-m", spec.model, "--host", host, "--port", str(port)]
        # Serve at the OpenAI path so the gateway forwards it unchanged.
        argv += ["--inference-path", "/v1/audio/transcriptions", "--convert"]
        if "threads" in cfg:
            argv += ["-t", str(cfg["threads"])]
        if "language" in cfg:
            argv += ["-l", str(cfg["language"])]
        return argv + list(cfg.get("extra_args", []))

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        if self.program(spec) is not None:
            return ("audio/transcriptions",)  # whisper-server's one path
        return ("audio/transcriptions", "audio/translations")

    def memory_estimate(self, spec: EngineSpec) -> estimate.Estimate | None:
        return estimate.scaled_file(spec.model, 1.3, 0.0, "file size")
