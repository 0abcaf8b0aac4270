"""django-q tasks of the on-demand controller."""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction
from django_q.tasks import async_task

from deployments.task_queue import wait_unless_stopping
from ondemand.litellm import sync
from ondemand.reaper import reap_once

PASSES = 4
EVERY_S = 15.0


def sync_litellm() -> dict[str, object] | None:
    """Register deployments with the site's LiteLLM proxy (every minute, and on changes)."""
    outcome = sync()
    return None if outcome is None else outcome.__dict__


def request_litellm_sync() -> None:
    """Queue a sync once the current transaction commits, where LiteLLM is configured."""
    if not settings.MSHIP_LITELLM_URL:
        return

    transaction.on_commit(enqueue_litellm_sync)


def enqueue_litellm_sync() -> None:
    if settings.MSHIP_LITELLM_URL:
        async_task(sync_litellm, group="litellm-sync")


def reap() -> list[str]:
    """Scheduled every minute (django-q's finest), it reaps every 15 s within that minute;
    a cluster asked to stop ends it after the pass under way."""
    stopped: list[str] = []
    for index in range(PASSES):
        began = time.monotonic()
        stopped += reap_once()
        if index < PASSES - 1 and wait_unless_stopping(
            max(0.0, EVERY_S - (time.monotonic() - began))
        ):
            break
    return stopped
