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
    "memory_gib",
    "num_gpus",
    "num_replicas",
)


def fingerprint(values: dict[str, Any]) -> str:
    canonical = json.dumps(
        {field: values.get(field) for field in CONFIG_FIELDS}, sort_keys=True, default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def deployment_fingerprint(deployment: Any) -> str:
    return fingerprint({field: getattr(deployment, field) for field in CONFIG_FIELDS})
