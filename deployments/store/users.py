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

from deployments.loaders import LOADERS
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
        for deployment, model, loader, config in Deployment.objects.values_list(
            "name", "model", "loader", "config"
        )
        if any(names_it(value, name, roots) for value in spellings(model, loader, config))
    )


def spellings(model: Any, loader: Any, config: Any) -> list[str]:
    """What of a deployment names a model on the host: its model, its loader's path options."""
    found = [model] if isinstance(model, str) else []
    options = getattr(LOADERS.get(str(loader or "")), "path_options", ())
    if isinstance(config, dict):
        found += [value for key, value in config.items() if key in options]
    return [value for value in found if isinstance(value, str) and value.strip()]


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
