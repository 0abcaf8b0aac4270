"""Failed sign-ins throttle further tries: the admin's login, Basic auth and /api tokens.

After MSHIP_LOGIN_MAX_FAILURES failures within MSHIP_LOGIN_WINDOW_S for one user name, or
from one client address, further tries for that name or from that address are refused
until the oldest of those failures is older than the window, right or wrong password
alike (so a guess that would have been right teaches nothing). The failures are rows in
the database, which every process of the site shares (serve --workers N, several hosts),
so the count is the site's, not a process's. A successful sign-in clears its user name's
failures, not its address's: one valid login does not buy a guesser more tries.

The address is the socket's peer (REMOTE_ADDR): behind a reverse proxy every client has
the proxy's address, so the address count then throttles everyone; the user name count
still holds.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone

from deployments.auth_models import LoginFailure

if TYPE_CHECKING:
    from django.http import HttpRequest


def keys_of(request: HttpRequest | None, username: str | None) -> list[str]:
    keys = []
    if username:
        keys.append(f"user:{username.strip().lower()}"[:200])
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    if address:
        keys.append(f"addr:{address}"[:200])
    return keys


def wait_s(keys: list[str]) -> int:
    """Seconds until a sign-in under these keys may be tried again; 0: now."""
    if not keys:
        return 0
    window = timedelta(seconds=settings.MSHIP_LOGIN_WINDOW_S)
    now = timezone.now()
    counts = (
        LoginFailure.objects.filter(key__in=keys, time__gte=now - window)
        .values("key")
        .annotate(failures=Count("id"), oldest=Min("time"))
    )
    waits = [
        (row["oldest"] + window - now).total_seconds()
        for row in counts
        if row["failures"] >= settings.MSHIP_LOGIN_MAX_FAILURES
    ]
    return max((math.ceil(w) for w in waits), default=0)


def failed(keys: list[str]) -> None:
    now = timezone.now()
    # Rows past the window count for nothing: dropped here, so the table stays small.
    LoginFailure.objects.filter(
        time__lt=now - timedelta(seconds=settings.MSHIP_LOGIN_WINDOW_S)
    ).delete()
    LoginFailure.objects.bulk_create([LoginFailure(key=key, time=now) for key in keys])


def succeeded(username: str) -> None:
    LoginFailure.objects.filter(key__in=keys_of(None, username)).delete()


def refusal(wait: int) -> str:
    minutes = max(1, math.ceil(wait / 60))
    return f"Too many failed sign-ins: try again in {minutes} minute{'s' if minutes > 1 else ''}."
