"""Settings of the model store (deployments/store/), read by settings.py. Models are pulled
into the first of MSHIP_MODEL_DIRS."""

from __future__ import annotations

from typing import Any

from common.env import env_bool, env_float, env_int

# Pulls running at once (each in a task of the cluster); more wait, queued, in order.
MSHIP_MODEL_PULLS = env_int("MSHIP_MODEL_PULLS", 2)
# A pull is refused before it starts where it would leave less than this free on the
# store's disk (engines, logs and the database share it).
MSHIP_MODEL_STORE_MIN_FREE_GIB = env_float("MSHIP_MODEL_STORE_MIN_FREE_GIB", 1.0)
# The longest one pull may run (its task's time limit in the cluster).
MSHIP_MODEL_PULL_TIMEOUT_S = env_float("MSHIP_MODEL_PULL_TIMEOUT_S", 6 * 3600)
# Hugging Face's Xet transfer for the files a repository stores in Xet (huggingface_hub uses it
# where hf-xet is installed): off, so every file comes over plain HTTP into the pull's folder,
# where the pull's progress, resume from a cut, cancel and hash check see it; Xet's chunks go
# to a cache of its own. On, large repositories may come faster, with those unseen.
MSHIP_HUB_XET = env_bool("MSHIP_HUB_XET", False)


def pulls_cluster(name: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """The pulls' own django-q cluster (deployments/store/pulls.py; `serve` runs it beside the
    main one, compose.yaml as its `pulls` service), so that a download of hours never holds a
    worker that starts and stops engines or runs the reaper: its name, and its ALT_CLUSTERS
    entry (a worker a pull slot, the pull's time limit)."""
    pulls = f"{name}-pulls"
    return pulls, {
        pulls: {
            "workers": max(1, MSHIP_MODEL_PULLS),
            "timeout": int(MSHIP_MODEL_PULL_TIMEOUT_S) + 60,
            "retry": int(MSHIP_MODEL_PULL_TIMEOUT_S) + 120,
        }
    }
