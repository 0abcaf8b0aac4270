"""A deployment's configuration fingerprint: what decides whether its engine must be replaced."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# The fields that shape the running engine. Mode, idle timeout and the system flag change how
# Modelship treats an engine, not the engine itself, so they are not part of it.
CONFIG_FIELDS = (
    "name",
    "aliases",
    "loader",
    "usecase",
    "model",
    "runtime",
    "image",
    "command",
    "config",
    "docker_options",
    "ray_resources",
    "memory_gib",
    "num_gpus",
    "num_replicas",
)


# Loaders whose engines load their adapters when they start (llama.cpp's --lora): each
# adapter shapes the engine. A vLLM engine loads them as it runs: only whether it has any
# (--enable-lora) does, but for a container, whose adapter folders are mounted as it starts.
ADAPTERS_AT_START = frozenset({"llama_server"})
LORA_ENABLED = frozenset({"vllm"})

# Fields added after engines were already running: left out while empty, so that an upgrade
# does not make every running engine look changed (and replaced at adoption).
LATER_FIELDS = frozenset({"ray_resources", "adapters"})


def fingerprint(values: dict[str, Any]) -> str:
    shaping = {
        field: values.get(field)
        for field in (*CONFIG_FIELDS, "adapters")
        if field not in LATER_FIELDS or values.get(field)
    }
    canonical = json.dumps(shaping, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def deployment_fingerprint(deployment: Any) -> str:
    values = {field: getattr(deployment, field) for field in CONFIG_FIELDS}
    if adapters := adapter_list(deployment):  # an engine that loads them when it starts
        values["adapters"] = adapters
    return fingerprint(values)


def adapter_list(base: Any) -> list[tuple[str, str]]:
    """What of a base's LoRA adapters shapes its engine: their names and models, where its
    engine loads them when it starts (deployments/adapters.py)."""
    loader = getattr(base, "loader", "")
    if getattr(base, "pk", None) is None or loader not in ADAPTERS_AT_START | LORA_ENABLED:
        return []
    if loader in LORA_ENABLED and getattr(base, "runtime", "") != "docker":
        return [("lora", "enabled")] if base.adapters.exists() else []
    return list(base.adapters.order_by("name").values_list("name", "model"))
