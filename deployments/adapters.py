"""LoRA adapters: deployments of their own (their own names, keys, rate limits, usage) whose
model is an adapter's weights and whose engine is their base's (`adapter_of`).

llama.cpp loads a base's adapters when it starts (`--lora`, each at scale 0, so the base
answers as itself) and a request names one with its `lora` field
(openai_api/adapters.py adds it): an adapter added to or removed from a running llama.cpp
base changes the base's fingerprint, and the base is replaced, as any change of its
configuration replaces it. An adapter never starts, stops or sleeps by itself: its base
does, on demand for the adapter's requests too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from deployments.fingerprint import ADAPTERS_AT_START
from deployments.loaders.vllm import DEFAULT_MAX_LORA_RANK
from deployments.refusals import OperationRefused
from deployments.store.metadata import describe, read_json
from deployments.store.refs import NotInStore, resolve

if TYPE_CHECKING:
    from deployments.models import Deployment

# Loaders whose running engines load an adapter on its first use (vLLM's
# /v1/load_lora_adapter); the others load theirs when they start (llama.cpp's --lora).
RUNTIME_ADAPTERS = frozenset({"vllm"})
SERVED_BY = ADAPTERS_AT_START | RUNTIME_ADAPTERS
# Settings an adapter takes from its base (an adapter set them to nothing).
BASE_ONLY = (
    "command",
    "image",
    "docker_options",
    "num_gpus",
    "autoscaling_config",
    "ray_resources",
)


class AdapterHasNoEngine(OperationRefused):
    status = 409
    code = "adapter"

    def __init__(self, adapter: Deployment) -> None:
        base = adapter.adapter_of.name if adapter.adapter_of else "its base"
        super().__init__(
            f"{adapter.name} is an adapter: it runs in {base}'s engine (start, stop or sleep"
            f" {base})"
        )


class BaseHasAdapters(OperationRefused):
    status = 409
    code = "conflict"

    def __init__(self, base: Deployment, names: list[str]) -> None:
        super().__init__(f"{base.name} is the base of {', '.join(names)}: remove them first")


def problems(values: dict[str, Any]) -> list[tuple[str, str]]:
    """What makes an adapter's values wrong: its base (none that is itself an adapter, one
    whose engine serves adapters), its loader (the base's), its model (an adapter's file)."""
    base = values.get("adapter_of")
    if base is None:
        return []
    found: list[tuple[str, str]] = []
    if base.adapter_of_id is not None:
        found.append(("adapter_of", f"{base.name} is an adapter itself"))
    if base.loader not in SERVED_BY:
        served = ", ".join(SERVED_BY)
        found.append(("adapter_of", f"a {base.loader} base serves no adapters here ({served} do)"))
    if values.get("loader") != base.loader:
        found.append(("loader", f"an adapter's loader is its base's ({base.loader})"))
    if base.name == values.get("name"):
        found.append(("adapter_of", "a deployment is not its own adapter"))
    if base.command or base.image:
        # Its engine is the administrator's own program: it may not load adapters at all.
        found.append(("adapter_of", f"{base.name} runs its own command or image"))
    for field in BASE_ONLY:
        if values.get(field):
            found.append((field, "an adapter runs in its base's engine: set it on the base"))
    found += [("model", message) for message in model_problems(values.get("model"), base)]
    return found


def model_problems(model: Any, base: Deployment) -> list[str]:
    """An adapter's model, on this host (stored, or in the model folders): a GGUF LoRA for
    llama.cpp, a PEFT folder (adapter_config.json) of a rank the base takes for vLLM. One
    not pulled yet is taken: its base loads it once it is there."""
    if not isinstance(model, str):
        return []
    try:
        path = resolve(model)
    except NotInStore as exc:
        return [] if exc.pending else [str(exc)]
    if base.loader in RUNTIME_ADAPTERS:
        return peft_problems(model, Path(path), base)
    try:
        found = describe(Path(path))
    except OSError:
        return [f"no adapter file at {model!r} on this host"]
    if found.format != "gguf" or found.details.get("type") != "adapter":
        return [f"{model!r} is not a GGUF LoRA adapter (general.type: adapter)"]
    return []


def peft_problems(model: str, path: Path, base: Deployment) -> list[str]:
    config = read_json(path / "adapter_config.json") if path.is_dir() else {}
    rank = config.get("r")
    if not isinstance(rank, int) or rank <= 0:
        return [f"{model!r} is not a LoRA adapter folder (adapter_config.json with its rank r)"]
    allowed = max_lora_rank(base)
    if rank > allowed:
        return [f"its rank {rank} is above the base's max_lora_rank {allowed}"]
    return []


def max_lora_rank(base: Any) -> int:
    config = base.config if isinstance(getattr(base, "config", None), dict) else {}
    value = config.get("max_lora_rank")
    return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_LORA_RANK


def has_adapters(base: Deployment) -> bool:
    return bool(base.pk) and base.adapters.exists()


def lora_files(base: Deployment) -> list[tuple[str, str]]:
    """The base's adapters as its engine loads them: (name, file), by name; one not there
    yet (being pulled) is left out."""
    files = []
    for adapter in base.adapters.order_by("name"):
        try:
            path = resolve(adapter.model)
        except NotInStore:
            continue
        # Absolute: a process engine runs in a folder of its own, and vLLM reads a relative
        # name as a Hub id.
        files.append((adapter.name, os.path.realpath(os.path.join(settings.BASE_DIR, path))))
    return files


def base_problems(current: Deployment, changes: dict[str, Any]) -> list[tuple[str, str]]:
    """What a change of an existing deployment may not do to adapters: make an adapter of
    it (or another base of an adapter: its engine ran as itself), or change the loader,
    command or image of a base that has adapters (its adapters are that engine's)."""
    found = []
    if "adapter_of" in changes and changes["adapter_of"] != current.adapter_of:
        found.append(("adapter_of", "set when a deployment is made: delete and make it anew"))
    if current.pk and current.adapters.exists():
        for field in ("loader", "command", "image"):
            if field in changes and changes[field] != getattr(current, field):
                found.append((field, f"{current.name} has adapters: remove them first"))
    return found
