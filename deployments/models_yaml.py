"""models.yaml: read and validate the whole file before anything changes.

Every problem is reported at once, each naming the model and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError

from common.spelling import unknown
from deployments.loaders import CONFIG_KEYS, LOADERS, Loader
from deployments.models import Deployment
from deployments.store.refs import suggestion
from deployments.validation import cross_field_problems, name_clashes

PLAIN_KEYS = {
    "name",
    "aliases",
    "model",
    "loader",
    "usecase",
    "runtime",
    "mode",
    "idle_timeout_s",
    "evictable",
    "preload",
    "priority",
    "max_concurrency",
    "num_gpus",
    "memory_gib",
    "num_replicas",
    "image",
    "command",
    "system",
    "responses",
    "ray_resources",
    "autoscaling_config",
}
# models.yaml keys stored under another field name.
RENAMED = {"docker": "docker_options"}
# Fields the model validates by itself; the rest of a Deployment is state, not configuration.
CHECKED_FIELDS = PLAIN_KEYS | {"config", "docker_options"}


def yaml_key(field: str, loader: Loader | None) -> str:
    """The models.yaml key a model field is written as."""
    if field == "config" and loader is not None:
        return loader.config_key
    return {v: k for k, v in RENAMED.items()}.get(field, field)


class ModelsFileError(Exception):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def load(path: str | Path) -> list[dict[str, Any]]:
    """Parse and validate a models.yaml; return one dict of Deployment fields per model."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ModelsFileError([f"{path}: {exc.strerror}"]) from exc
    except yaml.YAMLError as exc:
        raise ModelsFileError([f"{path}: not valid YAML: {exc}"]) from exc
    return parse(document)


def parse(document: Any) -> list[dict[str, Any]]:
    problems: list[str] = []
    if not isinstance(document, dict) or not isinstance(document.get("models"), list):
        raise ModelsFileError(["the file must be a mapping with a 'models:' list"])
    for key in sorted(set(document) - {"models"}):
        problems.append(unknown(key, {"models"}, "top-level key"))
    entries: list[dict[str, Any]] = []
    bases = bases_in(document["models"])
    for index, raw in enumerate(document["models"]):
        label = f"models[{index}]"
        if not isinstance(raw, dict):
            problems.append(f"{label}: must be a mapping")
            continue
        if isinstance(raw.get("name"), str):
            label = f"{label} ({raw['name']})"
        values, entry_problems = entry_values(raw, bases)
        problems += [f"{label}: {p}" for p in entry_problems]
        entries.append(values)
    names = [e.get("name") for e in entries]
    for name in sorted({n for n in names if n and names.count(n) > 1}):
        problems.append(f"model {name!r} is declared more than once")
    problems += name_clashes(
        (str(e.get("name")), list(e.get("aliases") or [])) for e in entries if e.get("name")
    )
    if problems:
        raise ModelsFileError(problems)
    return entries


def bases_in(models: list[Any]) -> dict[str, Deployment]:
    """The deployments an entry may be an adapter of, by name: the file's own (as far as an
    adapter's checks read them: name, loader, use) over those already there."""
    found = {d.name: d for d in Deployment.objects.filter(adapter_of__isnull=True)}
    for raw in models:
        if isinstance(raw, dict) and isinstance(raw.get("name"), str) and "adapter_of" not in raw:
            found[raw["name"]] = Deployment(
                name=raw["name"],
                loader=str(raw.get("loader", "")),
                usecase=str(raw.get("usecase", "generate")),
            )
    return found


def entry_values(
    raw: dict[str, Any], bases: dict[str, Deployment] | None = None
) -> tuple[dict[str, Any], list[str]]:
    problems: list[str] = []
    values: dict[str, Any] = {}
    config_blocks = []
    for key, value in raw.items():
        if key == "adapter_of":  # a base's name: the file's or one already there
            base = (bases or {}).get(str(value))
            if base is None:
                problems.append(f"adapter_of: no deployment {value!r} to be an adapter of")
            else:
                values["adapter_of"] = base
                raw = {"loader": base.loader, "usecase": base.usecase, **raw}
                values.setdefault("loader", base.loader)
                values.setdefault("usecase", base.usecase)
        elif key in PLAIN_KEYS:
            values[key] = value
        elif key in RENAMED:
            values[RENAMED[key]] = value if value is not None else {}
        elif key in CONFIG_KEYS:
            config_blocks.append(key)
        else:
            problems.append(
                unknown(key, {*PLAIN_KEYS, *RENAMED, *CONFIG_KEYS, "adapter_of"}, "key")
            )
    loader_name, usecase = suggestion(raw.get("model"))  # a stored model's format
    if "loader" not in raw and loader_name:
        raw = {**raw, "loader": loader_name}
        values["loader"] = loader_name
        values.setdefault("usecase", usecase)
    for key in ("name", "model", "loader"):
        if key not in raw:
            problems.append(f"{key!r} is required")
    loader = LOADERS.get(str(raw.get("loader")))
    for block in config_blocks:
        if loader is None or block != loader.config_key:
            problems.append(f"{block!r} does not belong to loader {raw.get('loader')!r}")
        else:
            values["config"] = raw[block] if raw[block] is not None else {}
    values.setdefault("runtime", settings.MSHIP_DEFAULT_RUNTIME)
    values.setdefault("usecase", "generate")
    values.setdefault("aliases", [])
    if values.get("aliases") is None:
        values["aliases"] = []
    if problems:
        return values, problems
    candidate = Deployment(**values)
    try:
        candidate.full_clean(validate_unique=False)
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            key = yaml_key(field, loader)
            problems += [f"{key}: {m}" for m in messages]
    else:
        values["priority"] = candidate.priority  # a name, as its number
    for field, messages in cross_field_problems(values).items():
        key = yaml_key(field, loader)
        problems += [m if m.startswith(key) else f"{key}: {m}" for m in messages]
    return values, problems
