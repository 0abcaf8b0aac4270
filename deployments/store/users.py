"""Which deployments name a stored model (it cannot be deleted from under them)."""

from __future__ import annotations

from deployments.models import Deployment
from deployments.store.models import STORE_PREFIX, StoredModel


def users_of(stored: StoredModel) -> list[str]:
    """The deployments that name it, by reference or by its path."""
    names = {STORE_PREFIX + stored.name, stored.path} - {""}
    return sorted(
        name
        for name, model in Deployment.objects.values_list("name", "model")
        if any(model == n or model.startswith(n + "/") for n in names)
    )
