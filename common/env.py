"""Settings from the environment, parsed strictly: a value that is not what the setting
takes stops the start with an error naming the variable, instead of quietly becoming a
default (MSHIP_AUTH=flase must not mean anything at all)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from common.networks import networks

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def raw(name: str) -> str | None:
    """The variable's value, None when it is unset or empty."""
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_secret(name: str, default: str) -> str:
    """A value that holds a secret (a URL with a password): from the file NAME_FILE names
    where that is set (a Docker secret, compose.yaml's generated ones), so the secret is in
    no container's environment; else NAME. Both set, or a file that cannot be read, stops the
    start, naming the variable."""
    path = raw(f"{name}_FILE")
    if path is None:
        return env_str(name, default)
    if raw(name) is not None:
        raise ImproperlyConfigured(f"{name} and {name}_FILE are both set: set one")
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}_FILE: {path} cannot be read ({exc.strerror})") from exc
    if not value:
        raise ImproperlyConfigured(f"{name}_FILE: {path} is empty")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`; anything else stops the start, naming the variable."""
    value = raw(name) or default
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_bool(name: str, default: bool) -> bool:
    value = raw(name)
    if value is None:
        return default
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name} must be true or false (or 1/0, yes/no, on/off), got {value!r}"
    )


def env_float(name: str, default: float) -> float:
    value = raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(number):
        raise ImproperlyConfigured(f"{name} must be a finite number, got {value!r}")
    return number


def env_int(name: str, default: int) -> int:
    value = raw(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        pass
    # 16e6 or 1.0 read as the whole number they are; 1.5 is refused.
    number = env_float(name, float(default))
    if not number.is_integer():
        raise ImproperlyConfigured(f"{name} must be a whole number, got {value!r}")
    return int(number)


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_networks(name: str, default: list[str]) -> list[str]:
    """A list of addresses or networks (10.0.0.0/8, ::1), each checked now: a typo must stop
    the start, not make every request that reads the list fail."""
    values = env_list(name, default)
    for value in values:
        try:
            networks([value])
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{name} must list addresses or networks, got {value!r}"
            ) from exc
    return values


def env_path(name: str, default: Path | str) -> Path:
    value = raw(name)
    return Path(value if value is not None else default)


def env_gpu_inventory(name: str) -> list[tuple[int, float]]:
    """A declared GPU inventory, GiB per device: `80,80` (devices 0 and 1) or `0:80,2:40`
    (by index). Empty: none declared (NVML's stands). Anything malformed stops the start."""
    value = raw(name)
    if value is None:
        return []
    devices: list[tuple[int, float]] = []
    for position, item in enumerate(value.split(",")):
        index_text, _, size_text = item.strip().rpartition(":")
        try:
            index = int(index_text) if index_text else position
            size = float(size_text)
        except ValueError:
            index, size = -1, math.nan
        if index < 0 or not math.isfinite(size) or size <= 0:
            raise ImproperlyConfigured(
                f"{name} must list each GPU's memory in GiB, as 80,80 or 0:80,1:80;"
                f" {item.strip()!r} is not one"
            )
        if index in dict(devices):
            raise ImproperlyConfigured(f"{name} names GPU {index} twice")
        devices.append((index, size))
    return sorted(devices)
