"""Who may decide what runs on the host.

A deployment's command, image, engine binary and container options (volumes, devices, user,
privileges, network, environment) choose a program and what it can reach: whoever sets them
runs code as Modelship. So do, less plainly, an engine flag that loads code or names a path
(vLLM's `trust_remote_code` or `tool_parser_plugin`, llama-server's `--log-file`), a plugin
from the package index (pip installs it, the engine imports it), and a model path outside
the model folders (the docker runtime bind-mounts it: `/var/run/docker.sock`). Setting any
of them takes the `deployments.run_arbitrary_engine` permission (superusers have every
permission), through every door: the admin, /api and `manage.py deploy --user`. Everything
else about a deployment needs only `change`: each loader lists the engine flags that are
safe for such a user (`Loader.operator_flags`), and the plugins an administrator allowed are
in MSHIP_PLUGINS.

This module is the one place that decides. What it compares is a deployment's *reach*: the
settings that need the permission, each with its value. A change is refused when it gives
the deployment reach it did not have, so a user with `change` may still edit the idle
timeout of a deployment an administrator gave a custom command.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from django.conf import settings

from deployments.engine_envs import PLUGIN_NAME, PLUGINS_DIR, allowed_plugins
from deployments.loaders import LOADERS, Loader
from deployments.refusals import OperationRefused
from deployments.store.models import STORE_PREFIX, store_dir
from deployments.store.refs import NotInStore, resolve

if TYPE_CHECKING:
    from collections.abc import Mapping

RUN_ARBITRARY_ENGINE = "deployments.run_arbitrary_engine"
# The model fields that choose what runs; a loader's `binary` option counts too.
HOST_FIELDS = ("command", "image", "docker_options")
HOST_CONFIG_KEYS = ("binary",)
# What a deployment runs and where: fixed by whoever gave it reach.
ENGINE_FIELDS = ("model", "loader", "runtime", "config")
ENGINE = "engine:"  # their keys in a deployment's reach
NEGATIVE_NUMBER = re.compile(r"-\d[\d.eE+-]*")


class HostAccessDenied(OperationRefused):
    status = 403
    code = "permission_denied"

    def __init__(self, reach: dict[str, str]) -> None:
        fields = {
            field: [
                f"{what} decides what runs on the host: it needs the {RUN_ARBITRARY_ENGINE}"
                " permission."
            ]
            for field, what in reach.items()
        }
        message = "; ".join(f"{field}: {texts[0]}" for field, texts in fields.items())
        super().__init__(message, fields)


def reach(values: Mapping[str, Any] | None) -> dict[str, tuple[str, Any]]:
    """The settings of a deployment that need the permission, by field: what to call each
    in a refusal, and the value compared between before and after (None: not set)."""
    values = values or {}
    found: dict[str, tuple[str, Any]] = {}
    for field in HOST_FIELDS:
        if values.get(field):
            found[field] = (f"Setting {field}", values[field])
    config = values.get("config") or {}
    config = config if isinstance(config, dict) else {}
    for key in HOST_CONFIG_KEYS:
        if config.get(key):
            found[f"config.{key}"] = (f"Setting config.{key}", config[key])
    model = values.get("model")
    if isinstance(model, str) and model.startswith(STORE_PREFIX):
        # A stored model is checked as the path it names; one not pulled yet cannot be.
        try:
            model = resolve(model)
        except NotInStore as exc:
            if exc.pending:  # what it will hold is not known yet (no such model: a 400)
                found["model"] = (f"A stored model that is not ready ({model!r})", model)
            model = None
    if isinstance(model, str) and (outside := outside_model_dirs(model)):
        found["model"] = (f"A model at {model!r} (outside MSHIP_MODEL_DIRS)", outside)
    loader = LOADERS.get(str(values.get("loader") or ""))
    if loader is not None:
        found.update(loader_reach(loader, config))
        if loader.imports_model_code and isinstance(model, str) and (code := python_in(model)):
            found["model"] = (f"A model folder with Python code ({code})", code)
    if found:
        # A deployment with reach is the administrator's: what it runs, and where, changes
        # only with the permission too (trust_remote_code stays safe only for the model and
        # revision it was given; a command left on the host runtime leaves its container).
        for field in ENGINE_FIELDS:
            what = f"Changing {field} of a deployment with host reach"
            found[ENGINE + field] = (what, values.get(field))
    return found


def loader_reach(loader: Loader, config: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """What of a loader's block reaches the host: unsafe engine flags, paths outside the
    model folders, a plugin no administrator allowed. Values carry the loader's name: the
    same option means another thing to another engine."""
    found: dict[str, tuple[str, Any]] = {}
    if loader.config_is_flags:  # vLLM: each key is an engine argument
        for key, value in config.items():
            if key not in HOST_CONFIG_KEYS and not safe_flag_value(loader, key, value):
                flag = "--" + key.replace("_", "-")
                found[f"config.{key}"] = (f"The engine flag {flag}", (loader.name, value))
    extra = config.get("extra_args")
    if isinstance(extra, list):
        unsafe = unsafe_flags(loader, [str(arg) for arg in extra])
        if unsafe:  # the whole list: the unsafe flags' values are what they reach
            found["config.extra_args"] = (
                f"extra_args {', '.join(unsafe)}",
                (loader.name, tuple(str(arg) for arg in extra)),
            )
    for option in loader.path_options:
        if option not in config:
            continue
        path = config[option]
        outside = outside_model_dirs(path, always_path=True) if isinstance(path, str) else path
        if outside:
            found[f"config.{option}"] = (
                f"{option} at {path!r} (outside MSHIP_MODEL_DIRS)",
                (loader.name, outside),
            )
    plugin = config.get("plugin")
    if loader.takes_plugins and isinstance(plugin, str) and not plugin_allowed(plugin):
        found["config.plugin"] = (
            f"The plugin {plugin!r} (not under plugins/ nor in MSHIP_PLUGINS)",
            (loader.name, plugin),
        )
    return found


def safe_flag_value(loader: Loader, key: str, value: Any) -> bool:
    """A vLLM argument an operator may pass: one on the loader's list, with a value that
    cannot be read as another flag."""
    if key.replace("_", "-") not in loader.operator_flags:
        return False
    return not (isinstance(value, str) and value.startswith("-"))


def unsafe_flags(loader: Loader, argv: list[str]) -> list[str]:
    """The flags of an extra_args list that are not on the loader's list (`--flag=value`
    is read as `--flag`; a negative number is a value)."""
    unsafe = []
    for arg in argv:
        if not arg.startswith("-") or NEGATIVE_NUMBER.fullmatch(arg):
            continue
        flag = arg.split("=", 1)[0]
        if flag.lstrip("-") not in loader.operator_flags and flag not in unsafe:
            unsafe.append(flag)
    return unsafe


def is_path(value: str) -> bool:
    """Whether a model value names a host path rather than a hub id (org/name): absolute,
    relative with dots, deeper than one slash, or present on disk (from here or from the
    site's folder, where engines' relative paths are read from)."""
    return (
        value.startswith(("/", ".", "~"))
        or value.count("/") > 1
        or "\\" in value
        or os.path.exists(value)
        or os.path.exists(os.path.join(settings.BASE_DIR, value))
    )


def python_in(model: str) -> str | None:
    """A Python file in a local model folder (an engine that loads a folder's custom
    components would import it); None where there is none, or no folder."""
    folder = os.path.join(settings.BASE_DIR, model)
    if not os.path.isdir(folder):
        return None
    for top, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".py"):
                return os.path.relpath(os.path.join(top, name), folder)
    return None


def outside_model_dirs(value: str, *, always_path: bool = False) -> str | None:
    """The resolved path a value names where it lies outside MSHIP_MODEL_DIRS; None for a
    hub id or a path inside them. A relative path is read from the site's folder."""
    if not value or value.startswith(STORE_PREFIX):
        return None  # a stored model: under the store, the first of the model folders
    if not (always_path or is_path(value)):
        return None
    resolved = os.path.realpath(os.path.join(settings.BASE_DIR, value))
    pulls = str(store_dir() / ".pulls")
    if resolved == pulls or resolved.startswith(pulls + "/"):
        return resolved  # a pull still writing: no model yet
    for folder in settings.MSHIP_MODEL_DIRS:
        if resolved == folder or resolved.startswith(folder.rstrip("/") + "/"):
            return None
    return resolved


def plugin_allowed(plugin: str) -> bool:
    """A plugin shipped under plugins/, or one an administrator allowed."""
    name = plugin.strip().lower()
    if not PLUGIN_NAME.fullmatch(name):
        return False
    return (PLUGINS_DIR / name).is_dir() or name in allowed_plugins()


def changed_reach(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, str]:
    """The reach a change gives (before None: a new deployment), by field, as named in a
    refusal. Clearing a command, image or binary counts: the engine it ran changes. What
    runs is named only where nothing else is: it changes with every new reach."""
    old, new = reach(before), reach(after)
    changed = {
        field: what
        for field, (what, value) in new.items()
        if field not in old or old[field][1] != value
    }
    for field, (what, _) in old.items():
        cleared = field in HOST_FIELDS or field.removeprefix("config.") in HOST_CONFIG_KEYS
        if cleared and field not in new:
            changed[field] = what
    primary = {field: what for field, what in changed.items() if not field.startswith(ENGINE)}
    if primary:
        return primary
    return {field.removeprefix(ENGINE): what for field, what in changed.items()}


def may_run_anything(user: Any) -> bool:
    return user is None or bool(user.has_perm(RUN_ARBITRARY_ENGINE))


def check(user: Any, before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> None:
    """HostAccessDenied when `user` gives a deployment reach without the permission. No
    user (a system actor, or the shell's operator) is trusted: they run as Modelship
    already."""
    if may_run_anything(user):
        return
    changed = changed_reach(before, after)
    if changed:
        raise HostAccessDenied(changed)
