"""What the on-demand controller reads of a deployment's row for make-room (whether it may
be stopped at all, pinned; whether it was loaded too recently to be taken first), and what
`serve` starts as it starts (preload)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from django_q.brokers import get_broker

from deployments.adoption import SHUTDOWN_REASON
from deployments.models import Deployment
from modelship_site.management.commands.serve import Command
from ondemand.adapter import view_of
from tests.conftest import take_queue

if TYPE_CHECKING:
    from collections.abc import Callable


def test_it_reads_a_pinned_and_a_recently_loaded_deployment(
    make_deployment: Callable[..., Deployment], settings: Any
) -> None:
    settings.MSHIP_MIN_RESIDENCY_S = 60
    now = timezone.now()
    fresh = make_deployment("fresh", mode="on_demand", state="ready", state_changed_at=now)
    settled = make_deployment(
        "settled", mode="on_demand", state="ready", state_changed_at=now - timedelta(minutes=2)
    )
    pinned = make_deployment("pinned", mode="on_demand", state="asleep", evictable=False)
    assert view_of(fresh).recently_loaded and not view_of(settled).recently_loaded
    assert not view_of(pinned).recently_loaded  # not ready: nothing loaded to protect
    assert not view_of(pinned).evictable and view_of(fresh).evictable
    settings.MSHIP_MIN_RESIDENCY_S = 0  # the site turned it off
    assert not view_of(fresh).recently_loaded


def test_it_starts_at_serve_what_the_shutdown_stopped_and_what_is_preloaded(
    make_deployment: Callable[..., Deployment],
) -> None:
    make_deployment("resumed", state="stopped", state_reason=SHUTDOWN_REASON)
    make_deployment("operator-stopped", state="stopped", state_reason="stopped by ops")
    make_deployment("preloaded", mode="on_demand", preload=True)
    make_deployment("preloaded-before", mode="on_demand", preload=True, state="stopped")
    make_deployment("failed-preload", mode="on_demand", preload=True, state="failed")
    make_deployment("lazy", mode="on_demand")
    make_deployment("running", mode="on_demand", preload=True, state="ready")
    get_broker().purge_queue()
    Command().resume_after_shutdown()
    queued = {(task["args"][0], task["args"][1]) for task in take_queue()}
    by_id = {d.pk: d.name for d in Deployment.objects.all()}
    assert {(by_id[pk], actor) for pk, actor in queued} == {
        ("resumed", "system"),
        ("preloaded", "preload"),
        ("preloaded-before", "preload"),
    }
