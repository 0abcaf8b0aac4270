"""The controller's deployer, for real: the deployments app, driven from the event loop.

Reads and the deployer's blocking calls run in threads; none of it is on a granted
request's path except the lease renewal, which the controller does ahead of time.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from django.conf import settings

from common.db_calls import fresh, off_loop
from deployments import audit, deployer, engine_secrets, memory, out_of_memory
from deployments.engine_metrics import Load, replicas_load
from deployments.gate import start_gate
from deployments.loaders import get_loader
from deployments.memory import need_gib
from deployments.models import Deployment, State
from ondemand import lease
from ondemand.coalesce import Coalesced
from ondemand.state import Budget, View
from openai_api.usage.held import gpu_share

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.nvml import GpuReading

ACTOR = "ondemand"
T = TypeVar("T")


@functools.cache
def engine_pool() -> ThreadPoolExecutor:
    """Threads for starts, wakes and stops: each may hold one for the start gate, an image
    pull or a health wait of up to the start timeout, and the default pool (the route
    refresh, the response store, lease writes) must never queue behind them."""
    workers = settings.MSHIP_ONDEMAND_START_THREADS
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ondemand-engine")


async def in_engine_thread(fn: Callable[..., T], *args: Any) -> T:
    run = functools.partial(fresh, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(engine_pool(), run)


def view_of(row: Deployment, gpus: list[GpuReading] | None = None) -> View:
    """The controller's view of a row; `gpus`, the inventory, when the caller has read it."""
    gpus = memory.gpu_inventory() if gpus is None else gpus
    return View(
        id=row.pk,
        name=row.name,
        state=row.state,
        on_demand=row.is_on_demand,
        need_gib=need_gib(row),
        idle_timeout_s=float(row.effective_idle_timeout_s),
        pending_mode=row.pending_mode,
        urls=tuple(row.engine_urls or ()),
        gauged=get_loader(row.loader).serves_metrics,
        lease_until=row.lease_until.timestamp() if row.lease_until else None,
        demand=memory.demand_of(row, on_gpus=True) if gpus else None,
        held=tuple(memory.held_by(row, gpus)) if gpus and row.state in memory.HELD_STATES else (),
        failures_forgiven=row.failures_forgiven,
        evictable=row.evictable,
        recently_loaded=recently_loaded(row),
        priority=row.priority,
        start_s=row.start_s,
        out_of_memory=row.state == State.FAILED
        and row.state_reason.startswith(out_of_memory.OUT_OF_MEMORY),
        wakes_on=tuple(i for replica in row.gpus or [] for i in replica)
        if row.state == State.ASLEEP
        else (),
        gpu_share=gpu_share(row, gpus),
        holds_gib=memory.holds_gib(row) if row.state == State.ASLEEP else None,
    )


def recently_loaded(row: Deployment) -> bool:
    """Ready for less than MSHIP_MIN_RESIDENCY_S (its state's age)."""
    if row.state != State.READY or row.state_changed_at is None:
        return False
    resident_s = time.time() - row.state_changed_at.timestamp()
    return resident_s < settings.MSHIP_MIN_RESIDENCY_S


def _views() -> list[View]:
    gpus = memory.gpu_inventory()
    return [view_of(row, gpus) for row in Deployment.objects.all()]


def _read(deployment_id: int) -> View | None:
    row = Deployment.objects.filter(pk=deployment_id).first()
    return None if row is None else view_of(row)


def _budget() -> Budget:
    host = memory.host_summary()
    return Budget(
        capacity_gib=host["on_demand_capacity_gib"],
        free_gib=host["free_gib"],
        devices=tuple(memory.devices()) if host["gpus"] else (),
        engines_on=tuple(memory.engines_on().items()) if host["gpus"] else (),
        gpu_cap=settings.MSHIP_MAX_LOADED_PER_GPU,
    )


def _restart(deployment_id: int, claimed: Callable[[], None] | None = None) -> None:
    # Audited only where this call started it: not when it already ran or was starting.
    started: list[bool] = []

    def on_start() -> None:
        started.append(True)
        if claimed is not None:
            claimed()

    row = deployer.restart(deployment_id, actor=ACTOR, on_start=on_start)
    if started:
        text = f"started for a request: {row.state}"
        audit.record("ondemand_start", row, actor=ACTOR, text=text)


def _prepare(deployment_id: int) -> bool:
    return deployer.prepare(deployment_id, actor=ACTOR) is not None


def _wake(deployment_id: int) -> None:
    woken: list[bool] = []
    row = deployer.wake(deployment_id, actor=ACTOR, on_start=lambda: woken.append(True))
    if woken:
        audit.record("ondemand_start", row, actor=ACTOR, text=f"woken for a request: {row.state}")


def _sample(deployment_id: int) -> Load | None:
    """A load sample of the deployment's engines, taken now: one read of the row, then
    their metrics."""
    row = Deployment.objects.filter(pk=deployment_id).first()
    if row is None:
        return None
    with httpx.Client(timeout=5.0) as client:
        urls, loader = list(row.engine_urls), get_loader(row.loader)
        return replicas_load(client, urls, loader, engine_secrets.auth(row))


def _stop(
    deployment_id: int, precheck: Callable[[View], bool], reason: str, room_for: int | None
) -> bool:
    def still_idle(row: Deployment) -> bool:
        return precheck(view_of(row))

    def still_short(row: Deployment) -> bool:
        return still_idle(row) and (
            memory.short_of_room(room_for or 0) or over_loaded_cap(room_for or 0)
        )

    if room_for is None:
        stopped = deployer.rest(deployment_id, precheck=still_idle, actor=ACTOR, reason=reason)
    else:
        # Make-room stops are decided one at a time across processes and hosts (the start-up
        # gate), each only while the room is still short: another process's stop, or its
        # start of the same model, may have made it meanwhile.
        with start_gate():
            # A sleeper is stopped: what it still holds is the room (a sleep would not take).
            asleep = Deployment.objects.filter(pk=deployment_id, state=State.ASLEEP).exists()
            down = deployer.stop if asleep else deployer.rest
            stopped = down(deployment_id, precheck=still_short, actor=ACTOR, reason=reason)
    if stopped:
        row = Deployment.objects.filter(pk=deployment_id).first()
        audit.record("ondemand_sleep", row, actor=ACTOR, text=reason)
    return stopped


def over_loaded_cap(deployment_id: int) -> bool:
    """Whether the deployment's start would still pass MSHIP_MAX_LOADED_MODELS (the stops under
    way no longer count as loaded)."""
    cap = settings.MSHIP_MAX_LOADED_MODELS
    if cap <= 0:
        return False
    loaded = Deployment.objects.filter(state__in=(State.STARTING, State.READY))
    return loaded.exclude(pk=deployment_id).count() >= cap


def _queue_timed_out(deployment_id: int, waited_s: float) -> None:
    row = Deployment.objects.filter(pk=deployment_id).first()
    if row is not None:
        text = f"a request waited {waited_s:.0f} s for memory to start {row.name} and gave up"
        audit.record("ondemand_queue_timeout", row, actor=ACTOR, text=text)


class DjangoDeployer:
    def __init__(self) -> None:
        # A burst of requests reads the row and writes the lease once, not once each.
        self._read = Coalesced(lambda deployment_id, _: fresh(_read, deployment_id))
        self._hold = Coalesced(lambda deployment_id, s: fresh(lease.extend, deployment_id, s))

    async def view(self, deployment_id: int) -> View | None:
        return await self._read(deployment_id)

    async def views(self) -> list[View]:
        return await off_loop(_views)

    async def restart(self, deployment_id: int, claimed: Callable[[], None] | None = None) -> None:
        await in_engine_thread(_restart, deployment_id, claimed)

    async def wake(self, deployment_id: int) -> None:
        await in_engine_thread(_wake, deployment_id)

    async def prepare(self, deployment_id: int) -> bool:
        return await in_engine_thread(_prepare, deployment_id)

    async def stop(
        self,
        deployment_id: int,
        precheck: Callable[[View], bool],
        reason: str,
        room_for: int | None = None,
    ) -> bool:
        return await in_engine_thread(_stop, deployment_id, precheck, reason, room_for)

    async def budget(self) -> Budget:
        return await off_loop(_budget)

    async def load(self, deployment_id: int) -> tuple[float, Load] | None:
        taken = time.monotonic()
        load = await off_loop(_sample, deployment_id)
        return None if load is None else (taken, load)

    async def hold(self, deployment_id: int, seconds: float) -> bool:
        return await self._hold(deployment_id, seconds) is not None

    async def queue_timed_out(self, deployment_id: int, waited_s: float) -> None:
        await off_loop(_queue_timed_out, deployment_id, waited_s)
