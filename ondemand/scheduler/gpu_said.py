"""What a gateway says of a request's GPU time on its link to the owner (ondemand/scheduler/
owner.py), read and bounded: the replica, its share and whose the request is as it begins,
its work as it ends (openai_api/usage/gpu_time.py)."""

from __future__ import annotations

from typing import Any

from ondemand.scheduler import wire
from openai_api.usage.gpu_time import Account, Work

MAX_SHARE = 1024.0  # GPUs one replica may hold, as a gateway says it (a bound, not a rule)
MAX_NAME = 200  # a deployment's name, as its model field bounds it
MAX_URL = 2048
MAX_COUNT = 10**12  # an id or a request's tokens, as a gateway says them (a bound)
MAX_FIRST_S = 86_400.0  # a stream's seconds to its first byte


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def begun(said: dict[str, Any]) -> tuple[str, float, Account]:
    """A request's start: its replica's address and share, and its account. WireError where
    a gateway said something else (the link ends: its gateway is broken)."""
    url, share = said.get("url"), said.get("share")
    key_id, team_id, model = said.get("key", 0), said.get("team", 0), said.get("model", "")
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise wire.WireError("a GPU share without an engine address")
    if not isinstance(share, int | float) or isinstance(share, bool):
        raise wire.WireError("a GPU share that is not a number")
    if not 0 <= share <= MAX_SHARE:
        raise wire.WireError("a GPU share out of bounds")
    if not (is_count(key_id) and is_count(team_id)):
        raise wire.WireError("a GPU share's key or team is not an id")
    if not isinstance(model, str) or len(model) > MAX_NAME:
        raise wire.WireError("a GPU share's deployment is not a name")
    return url, float(share), (key_id, team_id, model)


def work_of(said: Any) -> Work | None:
    """A request's work as a gateway said it ([prompt tokens computed, output tokens,
    seconds to its first byte or None]); None where it said none or not that (the request
    is then charged its time)."""
    if not isinstance(said, list) or len(said) != 3:
        return None
    prompt, output, first_s = said
    if not (is_count(prompt) and is_count(output)):
        return None
    if first_s is not None:
        if not isinstance(first_s, int | float) or isinstance(first_s, bool):
            return None
        if not 0 <= first_s <= MAX_FIRST_S:  # NaN and infinities fail this too
            return None
    return Work(prompt, output, None if first_s is None else float(first_s))
