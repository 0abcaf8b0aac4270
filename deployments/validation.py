"""Checks on a deployment's configuration that span fields, shared by models.yaml and the API.

Single-field rules live on the model's fields; these are the ones a field cannot see alone.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from django.conf import settings

from deployments import adapters, autoscaling, memory
from deployments.loaders import LOADERS, EngineSpec
from deployments.models import NAME_PATTERN, NAME_RULE, Mode, ResponsesBy, Runtime
from deployments.placement import Device, never_fits
from deployments.runtimes.docker_options import problems as docker_problems
from deployments.store.refs import reference_problem

if TYPE_CHECKING:
    from collections.abc import Iterable

Problems = dict[str, list[str]]


def cross_field_problems(values: dict[str, Any]) -> Problems:
    problems: Problems = {}

    def add(field: str, message: str) -> None:
        problems.setdefault(field, []).append(message)

    loader = LOADERS.get(values.get("loader", ""))
    if loader is None:
        return problems  # the field's own choices report it
    if values.get("memory_gib") is not None and values.get("num_gpus") is not None:
        add("memory_gib", "give num_gpus or memory_gib, not both")
    if values.get("system") and values.get("mode") == Mode.ON_DEMAND:
        add("mode", "a system deployment is always on")
    aliases = values.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        add("aliases", "must be a list of names")
        aliases = []
    elif values.get("name") in aliases or len(set(aliases)) != len(aliases):
        add("aliases", "repeats a name")
    for alias in aliases:
        # Served names follow --served-model-name on an engine's command line: one that
        # reads as a flag (--trust-remote-code) would be one.
        if not re.fullmatch(NAME_PATTERN, alias):
            add("aliases", f"{alias[:80]!r} is not a name: {NAME_RULE}")
    model = values.get("model")
    if isinstance(model, str) and (model.startswith("-") or not model.isprintable()):
        add("model", "a path or id: it starts with no '-' and holds no control characters")
    if stored := reference_problem(model):
        add("model", stored)
    for field, message in adapters.problems(values):
        add(field, message)
    if values.get("adapter_of") is not None:
        return problems  # an engine of no size of its own: nothing to place
    config = values.get("config") or {}
    if not isinstance(config, dict):
        add("config", f"{loader.config_key} must be a mapping")
        config = {}
    command = values.get("command")
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command)
    ):
        add("command", "must be a non-empty list of strings")
    spec = EngineSpec(
        name=str(values.get("name", "")),
        model=str(values.get("model", "")),
        usecase=str(values.get("usecase", "generate")),
        aliases=tuple(aliases),
        config=config,
        num_gpus=values.get("num_gpus"),
        memory_gib=values.get("memory_gib"),
    )
    for message in docker_problems(values.get("docker_options")):
        add("docker_options", message)
    for field, message in ray_problems(values):
        add(field, message)
    for message in autoscaling.problems(values.get("autoscaling_config")):
        add("autoscaling_config", message)
    scaling = values.get("autoscaling_config")
    if isinstance(scaling, dict) and scaling:
        if values.get("num_replicas") not in (None, 1):
            add("num_replicas", "give num_replicas or autoscaling_config, not both")
        to_zero = scaling.get("min_replicas") == 0
        if to_zero and (values.get("mode") == Mode.ALWAYS_ON or values.get("system")):
            add("autoscaling_config", "min_replicas 0 is on demand: not with always on")
    if values.get("responses") == ResponsesBy.ENGINE and not loader.native_responses:
        add("responses", f"the {loader.name} engine has no /v1/responses of its own")
    for message in loader.validate(spec):
        field = "usecase" if message.startswith("usecase") else "config"
        field = "num_gpus" if message.startswith("num_gpus") else field
        add(field, message)
    ray = values.get("runtime") == Runtime.RAY  # Ray's scheduler places it, on its nodes
    if not problems and not ray and (never := placement_problem(values, spec)):
        add("num_gpus" if values.get("num_gpus") is not None else "memory_gib", never)
    return problems


def ray_problems(values: dict[str, Any]) -> list[tuple[str, str]]:
    """The ray runtime's settings: an address to reach Ray, resources as Ray takes them."""
    found = []
    resources = values.get("ray_resources") or {}
    if values.get("runtime") == Runtime.RAY and not settings.MSHIP_RAY_ADDRESS:
        found.append(
            ("runtime", "the ray runtime needs MSHIP_RAY_ADDRESS (the Ray dashboard's URL)")
        )
    if not isinstance(resources, dict):
        return [*found, ("ray_resources", "must be a mapping of resource names to amounts")]
    if resources and values.get("runtime") != Runtime.RAY:
        found.append(("ray_resources", "only the ray runtime places by resources"))
    for name, amount in resources.items():
        number = isinstance(amount, int | float) and not isinstance(amount, bool)
        if not (number and 0 < amount < 2**20):
            found.append(
                ("ray_resources", f"{name}: must be a number from 0 to 2^20, not {amount!r}")
            )
        elif name in ("CPU", "GPU", "memory"):
            found.append(("ray_resources", f"{name}: set by num_gpus and memory_gib, not here"))
    return found


def placement_problem(values: dict[str, Any], spec: EngineSpec) -> str | None:
    """Why the deployment can never be placed on this host's GPUs, even all free (3 GPUs of
    a 2-GPU host); None where it can, or on a host without GPUs."""
    gpus = memory.gpu_inventory()
    if not gpus:
        return None
    shape = SimpleNamespace(
        loader=values.get("loader"),
        num_replicas=values.get("num_replicas") or 1,
        num_gpus=spec.num_gpus,
        memory_gib=spec.memory_gib,
        name=spec.name,
        model=spec.model,
        usecase=spec.usecase,
        aliases=list(spec.aliases),
        config=spec.config,
    )
    demand = memory.demand_of(shape, on_gpus=True)
    if demand is None:
        return None
    return never_fits(demand, [Device(g.index, g.total_gib, g.total_gib) for g in gpus])


def name_clashes(
    entries: Iterable[tuple[str, list[str]]], others: Iterable[tuple[str, list[str]]] = ()
) -> list[str]:
    """Served names (names and aliases) claimed twice, each as a sentence."""
    owner: dict[str, str] = {}
    clashes = []
    for name, aliases in [*others, *entries]:
        for served in [name, *aliases]:
            if served in owner and owner[served] != name:
                clashes.append(f"{served!r} is served by both {owner[served]!r} and {name!r}")
            owner.setdefault(served, name)
    return clashes
