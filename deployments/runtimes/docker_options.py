"""An operator's `docker:` block: checked, merged over the loader's defaults, made into the
keyword arguments of docker's containers.create."""

from __future__ import annotations

import math
import os
from typing import Any

from common.spelling import unknown

OPTIONS = {
    "gpus",
    "ipc_mode",
    "shm_size",
    "environment",
    "volumes",
    "mem_limit",
    "cpus",
    "working_dir",
    "user",
}
SIZE_CHARS = set("0123456789bkmgBKMG")


def problems(options: Any) -> list[str]:
    """Problems with a docker block, each naming its key."""
    if options in (None, {}):
        return []
    if not isinstance(options, dict):
        return ["docker: must be a mapping"]
    found = [f"docker: {unknown(key, OPTIONS, 'key')}" for key in sorted(set(options) - OPTIONS)]
    gpus = options.get("gpus")
    if gpus is not None and not (
        gpus == "all"
        or (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0)
        or (isinstance(gpus, list) and all(isinstance(g, int | str) for g in gpus))
    ):
        found.append("docker: gpus must be a count, a list of device ids or 'all'")
    for key in ("shm_size", "mem_limit"):
        value = options.get(key)
        if value is not None and not (
            isinstance(value, int)
            or (isinstance(value, str) and value and set(value) <= SIZE_CHARS)
        ):
            found.append(f"docker: {key} must be bytes or a size such as '8g'")
    env = options.get("environment")
    if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) for k in env)):
        found.append("docker: environment must be a mapping of names to values")
    volumes = options.get("volumes")
    if volumes is not None and not (
        isinstance(volumes, list)
        and all(isinstance(v, str) and v.count(":") in (1, 2) for v in volumes)
    ):
        found.append("docker: volumes must be a list of 'host:container[:ro|rw]'")
    cpus = options.get("cpus")
    if cpus is not None and not (isinstance(cpus, int | float) and cpus > 0):
        found.append("docker: cpus must be a positive number")
    return found


def gpu_request(gpus: Any) -> list[Any]:
    if gpus is None or gpus == 0:
        return []
    import docker.types  # noqa: PLC0415 - the SDK only where a container is made

    if gpus == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if isinstance(gpus, list):
        ids = [str(g) for g in gpus]
        return [docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
    return [docker.types.DeviceRequest(count=int(gpus), capabilities=[["gpu"]])]


def model_mount(model: str) -> list[str]:
    """A model given as a host path is mounted read-only where the engine expects it."""
    if not os.path.isabs(model) or not os.path.exists(model):
        return []
    folder = model if os.path.isdir(model) else os.path.dirname(model)
    return [f"{folder}:{folder}:ro"]


def create_kwargs(
    options: dict[str, Any],
    *,
    num_gpus: float | None,
    model: str,
    env: dict[str, str],
    mounts: list[str] | None = None,
    placed: list[int] | None = None,
    cache: str = "",
) -> dict[str, Any]:
    """Keyword arguments for containers.create from merged options. The GPUs are the ones
    placed for it (by device id) on a GPU host, else its num_gpus as a count; an operator's
    `gpus:` wins over both. The model cache is mounted read-write where it lies on the host."""
    gpus = options.get("gpus")
    if gpus is None and placed is not None:
        gpus = list(placed) or None
    elif gpus is None and num_gpus:
        gpus = math.ceil(num_gpus)  # a fraction of a GPU still needs the device
    shared = [f"{folder}:{folder}:ro" for folder in mounts or []]
    writable = [f"{cache}:{cache}:rw"] if cache else []
    volumes = [*model_mount(model), *shared, *writable, *options.get("volumes", [])]
    kwargs: dict[str, Any] = {
        "environment": {**env, **{k: str(v) for k, v in options.get("environment", {}).items()}},
        "volumes": volumes,
        "device_requests": gpu_request(gpus),
    }
    for key in ("ipc_mode", "shm_size", "mem_limit", "working_dir", "user"):
        if options.get(key) is not None:
            kwargs[key] = options[key]
    if options.get("cpus"):
        kwargs["nano_cpus"] = int(float(options["cpus"]) * 1e9)
    return kwargs
