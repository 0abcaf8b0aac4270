"""The watchdog: notices engines that died while they served, and restarts always-on ones.

A dead engine under a ready deployment would otherwise look ready to the admin, /readyz and
the gateway. An always-on deployment is started again, unless it died within
MSHIP_CRASH_RESTART_MIN_UPTIME_S of becoming ready: a crash loop stays failed for an operator.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from deployments import tasks
from deployments.audit import event
from deployments.health_wait import failure_reason, handles_of
from deployments.launch import stop_handles
from deployments.models import Deployment, Mode, State
from deployments.runtimes import EngineUnreachable, get_runtime
from deployments.task_queue import enqueue
from deployments.transitions import transition

log = logging.getLogger(__name__)


def check_once() -> list[str]:
    """The watchdog's scheduled task (setup_schedules), every minute: mark every ready or
    asleep deployment with a dead engine failed; returns their names."""
    failed = []
    for deployment in Deployment.objects.filter(state__in=(State.READY, State.ASLEEP)):
        handles = handles_of(deployment)
        runtime = get_runtime(deployment.runtime)
        try:
            dead = [h for h in handles if not runtime.is_alive(h)]
        except EngineUnreachable as exc:
            log.warning("%s: cannot check its engine: %s", deployment.name, exc)
            continue
        if not dead:
            continue
        up_since = deployment.state_changed_at
        why = f"{runtime.exit_reason(dead[0])} while it served"
        reason = failure_reason(deployment, dead, why)
        stop_handles(deployment, [h for h in handles if h not in dead])
        if not transition(
            deployment,
            State.FAILED,
            expected=[deployment.state],
            reason=reason,
            actor="watchdog",
            engine_urls=[],
            runtime_handle={},
            running_fingerprint="",
        ):
            continue
        failed.append(deployment.name)
        log.warning("%s: %s", deployment.name, why)
        uptime = (timezone.now() - up_since).total_seconds() if up_since else 0.0
        if deployment.effective_mode == Mode.ALWAYS_ON:
            if uptime >= settings.MSHIP_CRASH_RESTART_MIN_UPTIME_S:
                event(deployment, "restart_after_crash", why, actor="watchdog")
                enqueue(tasks.start, deployment.pk, "watchdog")
            else:
                event(
                    deployment,
                    "crash_loop",
                    f"not restarted: it died {uptime:.0f} s after it became ready",
                    actor="watchdog",
                )
    return failed
