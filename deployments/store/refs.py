"""Deployments naming stored models: `store:NAME` (what the model's metadata chose: its file
or folder) or `store:NAME/FILE` (one file of a stored folder, say one quantization of
several), resolved to a path under the store when an engine is built; and which deployments
name a stored model (it cannot be deleted from under them)."""

from __future__ import annotations

import os

from deployments.store.metadata import SUGGESTED
from deployments.store.models import STORE_PREFIX, PullState, StoredModel, store_dir


class NotInStore(Exception):
    """A deployment names a stored model that is not there, or not yet (`pending`: it is
    being pulled, or its pull failed)."""

    def __init__(self, message: str, pending: bool = False) -> None:
        super().__init__(message)
        self.pending = pending


def is_reference(model: str) -> bool:
    return model.startswith(STORE_PREFIX)


def split(model: str) -> tuple[str, str]:
    """The stored model's name and the file within it ("" for its own choice)."""
    name, _, inner = model.removeprefix(STORE_PREFIX).partition("/")
    return name, inner


def resolve(model: str) -> str:
    """The path a deployment's model names: a stored model's, else the value itself.
    Raises NotInStore where the stored model is missing, not pulled yet, or the file named
    within it is not there (or not inside it)."""
    if not is_reference(model):
        return model
    name, inner = split(model)
    stored = StoredModel.objects.filter(name=name).first()
    if stored is None:
        raise NotInStore(f"no model {name!r} in the store (modelship pull … --name {name})")
    if stored.state != PullState.READY:
        raise NotInStore(f"the stored model {name!r} is {stored.state}, not ready", pending=True)
    if not inner:
        return stored.path
    folder = os.path.realpath(store_dir() / name)
    target = os.path.realpath(os.path.join(folder, inner))
    if not target.startswith(folder + "/") or not os.path.exists(target):
        raise NotInStore(f"the stored model {name!r} holds no {inner!r}")
    return target


def resolved_or_same(model: str) -> str:
    """`resolve`, or the reference itself where it does not resolve (a page showing a
    deployment; a start fails on it with the reason)."""
    try:
        return resolve(model)
    except NotInStore:
        return model


def suggestion(model: object) -> tuple[str | None, str | None]:
    """The loader and use a stored model's format suggests, for a deployment naming it that
    gives none; (None, None) for anything else."""
    if not isinstance(model, str) or not is_reference(model):
        return None, None
    stored = StoredModel.objects.filter(name=split(model)[0]).first()
    return (None, None) if stored is None else suggested_for(stored)


def suggested_for(stored: StoredModel) -> tuple[str | None, str | None]:
    """The loader and use a stored model's format suggests (an embedding model's: embed)."""
    loader, usecase = SUGGESTED.get(stored.format, (None, None))
    return loader, "embed" if stored.details.get("embedding_model") else usecase


def reference_problem(model: object) -> str | None:
    """Why a deployment's store reference names nothing: no such stored model, or a file
    outside it. A model still being pulled is fine (a start waits for none: it fails until
    the pull is done)."""
    if not isinstance(model, str) or not is_reference(model):
        return None
    name, inner = split(model)
    stored = StoredModel.objects.filter(name=name).first()
    if stored is None:
        return f"no model {name!r} in the store"
    if inner and stored.state == PullState.READY:
        try:
            resolve(model)
        except NotInStore as exc:
            return str(exc)
    return None
