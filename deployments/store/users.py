"""Which deployments name a stored model: it cannot be deleted from under them, nor pulled
anew under its name by a user who may not choose what runs (deployments/store/pulls.py).

A deployment names one by reference (`store:NAME`, `store:NAME/FILE`) or by a path into its
folder, spelt any way an engine reads it: relative (from the site's folder, or Modelship's
working directory: deployments/launch.py), absolute, through a link, with `..` or a trailing
slash. Every spelling is resolved to the real path before it is compared, so `store:tiny`
and `var/models/store/tiny/` are one model. The model and the path options of its loader
(llama.cpp's `mmproj`) count.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings

from deployments.models import Deployment
from deployments.store.models import StoredModel, store_dir
from deployments.store.refs import is_reference, split


def users_of(stored: StoredModel) -> list[str]:
    """The deployments that name it, by reference or by a path into it."""
    return users_of_name(stored.name, stored.path)


def users_of_name(name: str, *paths: str) -> list[str]:
    """The deployments that name the stored model `name` (there or not: one named before it
    is pulled), by reference or by a path into its folder (or into `paths`), by name."""
    roots = {real_path(store_dir() / name)} | {real_path(path) for path in paths if path}
    return sorted(
        deployment
        for deployment, *fields in Deployment.objects.values_list(
            "name", "model", "config", "command", "docker_options"
        )
        if any(names_it(value, name, roots) for value in spellings(*fields))
    )


MAX_STRINGS = 4096  # of one deployment's configuration: it is an operator's, bounded anyway


def spellings(*fields: Any) -> list[str]:
    """Every string of a deployment that may name a model on the host: its model, and any
    in its configuration, command and container options (an `extra_args` `--mmproj=…`, a
    vLLM `tokenizer`, a volume), `--flag=value` read as its value too."""
    found: list[str] = []
    pending = list(fields)
    while pending and len(found) < MAX_STRINGS:
        item = pending.pop()
        if isinstance(item, str) and item.strip():
            found.append(item)
            if item.startswith("-") and "=" in item:
                found.append(item.split("=", 1)[1])
        elif isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            pending += list(item)
    return found


def names_it(value: str, name: str, roots: set[str]) -> bool:
    if is_reference(value):
        return split(value)[0] == name
    return any(
        path == root or path.startswith(root.rstrip("/") + "/")
        for path in readings(value)
        for root in roots
    )


def readings(value: str) -> set[str]:
    """Each real path a model value may be read as: from the site's folder (where
    host_access reads it), from the working directory (where an engine's launch looks next),
    with `~` expanded."""
    value = value.strip()
    return {
        real_path(os.path.join(settings.BASE_DIR, value)),
        real_path(os.path.join(os.getcwd(), value)),
        real_path(os.path.expanduser(value)),
    }


def real_path(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))
