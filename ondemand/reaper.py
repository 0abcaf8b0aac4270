"""The idle reaper, as it runs in the django-q cluster: puts every on-demand deployment that
is idle by the seed's rules to sleep where its engine sleeps (vLLM sleep mode), else stops
it, each one approved under the row's lock only once the gateways' lease has lapsed."""

from __future__ import annotations

import logging

import httpx
from django.conf import settings
from django.utils import timezone

from common import metrics
from deployments import audit, deployer, engine_secrets
from deployments.engine_metrics import replicas_load
from deployments.loaders import get_loader
from deployments.models import Deployment, Mode, State
from deployments.runtimes import EngineUnreachable
from ondemand import baseline, policy
from ondemand.lease import lapsed

log = logging.getLogger(__name__)
ACTOR = "ondemand"


def idle_by_load(client: httpx.Client, deployment: Deployment) -> bool:
    """Every replica's engine reports nothing running or waiting (a sample taken now); an
    engine with no load gauges has only the gateways' slots to go by (the lease)."""
    loader = get_loader(deployment.loader)
    if not loader.serves_metrics:
        return True
    urls = list(deployment.engine_urls)
    load = replicas_load(client, urls, loader, engine_secrets.auth(deployment))
    return load is not None and policy.load_is_idle(0.0, load.idle)


def activity_of(row: Deployment) -> policy.Activity:
    """The idle rules' view from the cluster: the slots live in the gateways, and their
    lease on the row stands for them; once it has lapsed none is held and the idle timeout
    has passed (ondemand/lease.py)."""
    idle_timeout_s = float(row.effective_idle_timeout_s)
    held = not lapsed(row, timezone.now())
    return policy.Activity(
        on_demand=row.effective_mode == Mode.ON_DEMAND,
        state=row.state,
        pending_mode=row.pending_mode,
        busy=held,
        idle_for_s=0.0 if held else idle_timeout_s,
        idle_timeout_s=idle_timeout_s,
    )


def approve(row: Deployment) -> bool:
    """The precheck, on the freshly read, locked row: ready (the reaper leaves asleep ones
    be) and idle by the rules the gateway's controller applies too."""
    return row.state == State.READY and not baseline.kept(row) and policy.is_idle(activity_of(row))


def slept_long(row: Deployment) -> bool:
    """The last tier: asleep for MSHIP_SLEEP_MAX_S (its host memory and process are freed)."""
    limit = settings.MSHIP_SLEEP_MAX_S
    if not limit or row.state != State.ASLEEP or row.state_changed_at is None:
        return False
    return (timezone.now() - row.state_changed_at).total_seconds() >= limit


def stop_long_sleepers() -> list[str]:
    stopped = []
    hours = settings.MSHIP_SLEEP_MAX_S / 3600
    text = f"Stopped after {hours:g} h asleep"
    for row in Deployment.objects.filter(state=State.ASLEEP, pending_mode__isnull=True):
        if not slept_long(row):
            continue
        try:
            if deployer.stop(row.pk, precheck=slept_long, actor=ACTOR, reason=text):
                audit.record("ondemand_stop", row, actor=ACTOR, text=text)
                stopped.append(row.name)
                metrics.evictions.labels(row.name, "slept_long").inc()
                metrics.tier_changes.labels(row.name, "stopped").inc()
        except EngineUnreachable as exc:
            log.warning("%s: not stopped: %s", row.name, exc)
    return stopped


def reap_once() -> list[str]:
    """The names of the deployments put away, "(asleep)" after those put to sleep, and
    "(baseline)" after those the baseline started again."""
    stopped = stop_long_sleepers()
    stopped += [f"{name} (baseline)" for name in baseline.restore()]
    # An unset mode may be on demand too (scaling to zero): approve() reads the effective
    # mode, the query only leaves out what is always on for sure.
    candidates = Deployment.objects.filter(
        system=False, state=State.READY, pending_mode__isnull=True
    ).exclude(mode=Mode.ALWAYS_ON)
    with httpx.Client(timeout=5.0) as client:
        for deployment in candidates:
            if not approve(deployment) or not idle_by_load(client, deployment):
                continue
            minutes = round(deployment.effective_idle_timeout_s / 60)
            text = f"Put to sleep after {minutes} min idle"
            try:
                if not deployer.rest(deployment.pk, precheck=approve, actor=ACTOR, reason=text):
                    continue
            except EngineUnreachable as exc:
                log.warning("%s: not reaped: %s", deployment.name, exc)
                continue
            audit.record("ondemand_sleep", deployment, actor=ACTOR, text=text)
            deployment.refresh_from_db(fields=["state"])
            asleep = deployment.state == State.ASLEEP
            stopped.append(f"{deployment.name} (asleep)" if asleep else deployment.name)
            metrics.evictions.labels(deployment.name, "idle").inc()
    return stopped
