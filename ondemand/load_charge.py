"""A start's or a wake's GPU-seconds, attributed to the requests that waited for it (README,
"Usage and budgets"): the deployment's load account is read from its state events
(openai_api/usage/held.py); this says whose requests it was for, shared equally among them,
and counts it against their GPU-second budgets where MSHIP_USAGE_BUDGET_LOADS is on."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from common import metrics
from openai_api.usage import recording
from openai_api.usage.held import held_seconds

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ondemand.state import View, Waiter

log = logging.getLogger(__name__)


def loaded(view: View, waiters: Iterable[Waiter], seconds: float) -> None:
    """A start or wake of `view` took `seconds` to ready, for these waiting requests."""
    metrics.cold_start_duration.labels(view.name).observe(seconds)
    try:
        charge(view, [waiter.key_id for waiter in waiters], seconds)
    except Exception:  # the start succeeded all the same: its waiters are served
        log.exception("the load of %s not attributed", view.name)


def charge(view: View, key_ids: Sequence[int | None], seconds: float) -> None:
    """`seconds` of loading that just ended, on `view`'s GPU share, for these requests'
    keys (None: a request of no key), each part booked to the minutes it lay in."""
    if view.gpu_share <= 0 or seconds <= 0 or not key_ids:
        return
    end = time.time()
    loading = (datetime.fromtimestamp(end - seconds, UTC), datetime.fromtimestamp(end, UTC))
    by_minute = held_seconds([loading], "minute")
    each = view.gpu_share / len(key_ids)
    for key_id in key_ids:
        account = (key_id or 0, 0, view.name)  # its team: the key's, as booking reads it
        for opened, length in by_minute.items():
            assert opened is not None
            recording.book_load(account, int(opened.timestamp()), each * length)
