"""The baseline: the on-demand deployments marked `preload` are started when `serve` starts
and again once the host has been idle for MSHIP_BASELINE_AFTER_S, so that what a quiet night
or a burst of other models put away is loaded before the morning's first request.

Idle: nothing starting or stopping, no gateway holding a lease on any on-demand deployment (no
request for MSHIP_BASELINE_AFTER_S past its idle timeout), and no deployment's state changed
for that long. Only what fits in the memory free now (and under MSHIP_MAX_LOADED_MODELS) is
started: the baseline never stops anything to make room. A baseline model is not put away by
its idle timeout while the baseline is on (`kept`): make-room takes it when another model
needs its memory, as it takes any unused model. Run by the reaper, in the django-q cluster.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from common import metrics
from deployments import deployer
from deployments.memory import InsufficientMemory, check_fit
from deployments.models import Deployment, Mode, State
from deployments.runtimes import EngineUnreachable

ACTOR = "baseline"
BUSY = (State.STARTING, State.STOPPING)


def host_idle_since(quiet_s: float) -> bool:
    now = timezone.now()
    if Deployment.objects.filter(state__in=BUSY).exists():
        return False
    if Deployment.objects.filter(lease_until__gt=now - timedelta(seconds=quiet_s)).exists():
        return False
    last = Deployment.objects.aggregate(last=Max("state_changed_at"))["last"]
    return last is None or (now - last).total_seconds() >= quiet_s


def kept(row: Deployment) -> bool:
    """A baseline model stays loaded through its idle timeouts (else it would be put away and
    restored again every quiet half hour)."""
    return row.preload and float(settings.MSHIP_BASELINE_AFTER_S) > 0


def missing() -> list[Deployment]:
    """The baseline deployments that run nothing (a failed one waits for a request or an
    operator: restarting it every pass would fail every pass)."""
    rows = Deployment.objects.filter(preload=True, state__in=(State.PLANNED, State.STOPPED))
    return [row for row in rows if row.effective_mode == Mode.ON_DEMAND]


def restore() -> list[str]:
    """Start the missing baseline deployments that fit now, once the host has been idle."""
    quiet_s = float(settings.MSHIP_BASELINE_AFTER_S)
    if quiet_s <= 0 or not host_idle_since(quiet_s):
        return []
    started = []
    for row in missing():
        cap = int(settings.MSHIP_MAX_LOADED_MODELS)
        loaded = Deployment.objects.filter(state__in=(State.STARTING, State.READY)).count()
        if cap and loaded >= cap:
            break  # no room under the loaded-model cap: the baseline stops nothing
        try:
            check_fit(row)
            deployer.restart(row.pk, actor=ACTOR)
        except (InsufficientMemory, EngineUnreachable):
            continue  # no room without stopping something, or its runtime is down
        row.refresh_from_db(fields=["state"])
        if row.state == State.READY:
            metrics.starts.labels(row.name, "baseline").inc()
            started.append(row.name)
    return started
