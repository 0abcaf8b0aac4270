"""django-q tasks of the public gateway."""

from __future__ import annotations

from openai_api.responses import store


def sweep_responses() -> int:
    """Delete stored responses past MSHIP_RESPONSES_TTL_S (scheduled hourly)."""
    return store.sweep()
