"""The GPU-seconds a deployment held, and of them those it spent loading: its held periods,
read from its state events (a deployment holds its GPUs from entering starting, ready or
stopping, or from a wake's "waking" event, until it enters any other state), times its
replicas' GPU share (openai_api/usage/gpu_share.py). Its load account is the time from
entering starting (a launch) or waking until its next state: what a start or a wake costs.

What it held less its load and what its requests were charged is its idle account
(openai_api/usage/report.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from deployments.models import HOLDING_STATES, Deployment, DeploymentEvent, State
from openai_api.usage.gpu_share import replica_shares

if TYPE_CHECKING:
    from deployments.nvml import GpuReading

Period = tuple[datetime, datetime]
WAKING = "waking"  # the event a wake writes as it starts (deployments/deployer.py)
STATES = (*(state.value for state in State), WAKING)
HOLDING = frozenset({*(state.value for state in HOLDING_STATES), WAKING})
LOADING = frozenset({State.STARTING.value, WAKING})
# Time buckets a report may group by, and their length.
BUCKETS = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
}


def gpu_share(deployment: Deployment, gpus: list[GpuReading] | None = None) -> float:
    """The GPUs all its replicas hold together (0: none; `gpus`: the host's inventory, where
    the caller read it already)."""
    return sum(replica_shares(deployment, deployment.num_replicas, gpus))


def account_periods(
    name: str, since: datetime, until: datetime
) -> tuple[list[Period], list[Period]]:
    """When the deployment of this name held its GPUs between `since` and `until`, and when
    it was loading (a start from launch to ready, a wake): its state at `since` is the one
    its last event before then entered."""
    events = DeploymentEvent.objects.filter(deployment_name=name, kind__in=STATES)
    before = events.filter(time__lt=since).order_by("-time", "-id").values_list("kind", flat=True)
    last = before.first()
    start: datetime | None = since if last in HOLDING else None
    loading: datetime | None = since if last in LOADING else None
    held: list[Period] = []
    loads: list[Period] = []
    within = events.filter(time__gte=since, time__lt=until).order_by("time", "id")
    for kind, time in within.values_list("kind", "time"):
        if loading is not None and loading < time:
            loads.append((loading, time))
        loading = time if kind in LOADING else None
        if kind in HOLDING:
            start = time if start is None else start
        elif start is not None:
            held.append((start, time))
            start = None
    if start is not None and start < until:
        held.append((start, until))
    if loading is not None and loading < until:
        loads.append((loading, until))
    return held, loads


def bucket_of(moment: datetime, bucket: str) -> datetime:
    """The start of the UTC minute, hour or day the moment falls in."""
    moment = moment.astimezone(UTC)
    if bucket == "minute":
        return moment.replace(second=0, microsecond=0)
    if bucket == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def held_seconds(periods: list[Period], bucket: str | None) -> dict[datetime | None, float]:
    """Seconds held in each time bucket (its start; None: no buckets, the whole range)."""
    held: dict[datetime | None, float] = {}
    for start, end in periods:
        if bucket is None:
            held[None] = held.get(None, 0.0) + (end - start).total_seconds()
            continue
        moment = start
        while moment < end:
            opened = bucket_of(moment, bucket)
            closed = min(end, opened + BUCKETS[bucket])
            held[opened] = held.get(opened, 0.0) + (closed - moment).total_seconds()
            moment = closed
    return held


def held_gpu_seconds(
    deployment: Deployment, since: datetime, until: datetime, bucket: str | None = None
) -> dict[datetime | None, tuple[float, float]]:
    """GPU-seconds it held and, of them, spent loading, per time bucket (None: over the
    whole range)."""
    share = gpu_share(deployment)
    if share <= 0 or until <= since:
        return {}
    periods, loads = account_periods(deployment.name, since, until)
    held, loading = held_seconds(periods, bucket), held_seconds(loads, bucket)
    return {
        opened: (seconds * share, loading.get(opened, 0.0) * share)
        for opened, seconds in held.items()
    }
