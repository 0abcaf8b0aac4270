"""Settings of the model store (deployments/store/), read by settings.py. Models are pulled
into the first of MSHIP_MODEL_DIRS."""

from __future__ import annotations

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
