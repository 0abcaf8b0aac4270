"""What an engine makes a request with where the request itself sets nothing: its sampling
(temperature, top_p) and the length of an answer whose request names no limit, as the
deployment's configuration gives them to the engine (llama-server's `--temp`, `--top-p` and
`--n-predict`, vLLM's generation config, the simulated engine's options) or as the engine's
own defaults are known. The gateway reports them: a Responses object says what it was made
with (openai_api/responses/made_with.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RequestDefaults:
    """None: not known here."""

    temperature: float | None = None
    top_p: float | None = None
    # The answer length of a request that names none (llama-server's -n, vLLM's
    # max_new_tokens); not the most a request may ask for (Loader.output_token_limit).
    max_output_tokens: int | None = None


UNKNOWN = RequestDefaults()  # nothing known


def number(value: Any) -> float | None:
    """A finite number given as one or as its digits; None for anything else."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def count(value: Any) -> int | None:
    """A positive whole number given as one or as its digits; None for anything else."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def flag_value(args: Any, *names: str) -> str | None:
    """The value an engine's command line gives a flag (`--temp 0.2` or `--temp=0.2`), the
    last one where it is given twice (as the engines read it); None where it is not given."""
    if not isinstance(args, list):
        return None
    found: str | None = None
    for index, arg in enumerate(args):
        if not isinstance(arg, str):
            continue
        flag, equals, value = arg.partition("=")
        if flag not in names:
            continue
        if equals:
            found = value
        elif index + 1 < len(args) and isinstance(args[index + 1], str):
            found = args[index + 1]
    return found


def llama_server(extra_args: Any) -> RequestDefaults:
    """llama-server's: its flags where the operator gave them, else llama.cpp's own sampling
    (temperature 0.8, top_p 0.95); an answer length of -1 (up to the context) is not one."""
    temperature = number(flag_value(extra_args, "--temp"))
    top_p = number(flag_value(extra_args, "--top-p"))
    return RequestDefaults(
        temperature=LLAMA_TEMPERATURE if temperature is None else temperature,
        top_p=LLAMA_TOP_P if top_p is None else top_p,
        max_output_tokens=count(flag_value(extra_args, "-n", "--predict", "--n-predict")),
    )


LLAMA_TEMPERATURE = 0.8  # llama.cpp's common_params_sampling
LLAMA_TOP_P = 0.95


def vllm(model: str, config: dict[str, Any]) -> RequestDefaults:
    """vLLM's: its generation config (`generation_config: auto`, the default, reads the
    model's own generation_config.json, known here for a model folder on this host; `vllm`
    reads none), with `override_generation_config` over it."""
    source = config.get("generation_config", "auto")
    folder = model if source == "auto" else source if source != "vllm" else None
    values = read_generation_config(folder) if isinstance(folder, str) else {}
    override = config.get("override_generation_config")
    if isinstance(override, str):
        try:
            override = json.loads(override)
        except ValueError:
            override = None
    if isinstance(override, dict):
        values = {**values, **override}
    return RequestDefaults(
        temperature=number(values.get("temperature")),
        top_p=number(values.get("top_p")),
        max_output_tokens=count(values.get("max_new_tokens")),
    )


def read_generation_config(folder: str) -> dict[str, Any]:
    """A model folder's generation_config.json; empty where there is none to read."""
    try:
        path = Path(folder) / "generation_config.json"
        if not path.is_file() or path.stat().st_size > 1_000_000:
            return {}
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
