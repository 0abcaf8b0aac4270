"""The store's disk: what its models take, what is left."""

from __future__ import annotations

import shutil
from typing import Any

from deployments.store.job import folder_size
from deployments.store.models import PullState, StoredModel, store_dir


def disk_summary() -> dict[str, Any]:
    """The store's folder, what its models take and what its disk has left."""
    folder = store_dir()
    folder.mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(folder)
    models = StoredModel.objects.filter(state=PullState.READY)
    used = sum(m.size_bytes or 0 for m in models)
    pulling = folder_size(folder / ".pulls") if (folder / ".pulls").exists() else 0
    return {
        "path": str(folder),
        "models": models.count(),
        "used_bytes": used + pulling,
        "free_bytes": usage.free,
        "total_bytes": usage.total,
    }
