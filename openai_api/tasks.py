"""django-q tasks of the public gateway."""

from __future__ import annotations

from openai_api.responses import replay, store


def sweep_responses() -> int:
    """Delete stored responses past MSHIP_RESPONSES_TTL_S and expired replay-log events
    (scheduled hourly)."""
    return store.sweep() + replay.sweep()
