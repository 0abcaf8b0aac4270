"""A deployer for the on-demand controller's tests (tests/test_ondemand_controller.py,
tests/test_scheduler.py): deployments with states and a memory budget, starts the test
finishes by hand, on the fake clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from deployments.engine_metrics import Load
from deployments.memory import InsufficientMemory
from ondemand.state import Budget, View

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.fake_clock import FakeClock

HOLDING = ("starting", "ready", "stopping")


class FakeDeployer:
    """Deployments with states, a memory budget, and starts the test finishes by hand."""

    def __init__(self, clock: FakeClock, capacity: float = 10.0) -> None:
        self.clock = clock
        self.capacity = capacity
        self.rows: dict[int, View] = {}
        self.always_on: set[int] = set()
        self.gates: dict[int, asyncio.Future[str]] = {}
        self.starts: list[str] = []
        self.stops: list[tuple[str, str]] = []
        self.loads: dict[int, tuple[float, Load]] = {}
        self.holds: list[int] = []
        self.timeouts: list[tuple[int, float]] = []
        self.leases: dict[int, float] = {}
        # With slow_release, a stopped engine's memory reads as used until release(id).
        self.slow_release = False
        self.releasing: dict[int, float] = {}
        # An install held by the test (its future's result: whether it succeeded).
        self.installs: dict[int, asyncio.Future[bool]] = {}
        self.prepared: list[str] = []  # the starts whose image and environment were made

    def add(self, id: int, name: str, need: float, state: str = "stopped", **kw: Any) -> View:
        view = View(
            id=id,
            name=name,
            state=state,
            on_demand=kw.pop("on_demand", True),
            need_gib=need,
            idle_timeout_s=kw.pop("idle_timeout_s", 600.0),
            **kw,
        )
        self.rows[id] = view
        return view

    def set_state(self, id: int, state: str) -> None:
        self.rows[id] = replace(self.rows[id], state=state)

    def held(self) -> float:
        running = sum(v.need_gib for v in self.rows.values() if v.state in HOLDING)
        return running + sum(self.releasing.values())

    def release(self, deployment_id: int) -> None:
        self.releasing.pop(deployment_id)

    async def view(self, deployment_id: int) -> View | None:
        return self.rows.get(deployment_id)

    async def views(self) -> list[View]:
        return list(self.rows.values())

    async def restart(self, deployment_id: int, claimed: Callable[[], None] | None = None) -> None:
        await self._start(deployment_id, claimed)

    async def wake(self, deployment_id: int) -> None:
        await self._start(deployment_id)

    async def prepare(self, deployment_id: int) -> bool:
        self.prepared.append(self.rows[deployment_id].name)
        held = self.installs.get(deployment_id)
        if held is None:
            return True
        if not await held:
            self.set_state(deployment_id, "failed")
        return held.result()

    async def _start(self, deployment_id: int, claimed: Callable[[], None] | None = None) -> None:
        view = self.rows[deployment_id]
        free = self.capacity - self.held()
        if view.need_gib > free:
            raise InsufficientMemory(view.name, view.need_gib, free, self.capacity)
        self.starts.append(view.name)
        self.set_state(deployment_id, "starting")
        if claimed is not None:
            claimed()
        gate = self.gates[deployment_id] = asyncio.get_running_loop().create_future()
        outcome = await gate
        if deployment_id in self.rows and self.rows[deployment_id].state == "starting":
            self.set_state(deployment_id, outcome)

    def finish(self, deployment_id: int, outcome: str = "ready") -> None:
        self.gates.pop(deployment_id).set_result(outcome)

    async def stop(
        self, deployment_id: int, precheck: Any, reason: str, room_for: int | None = None
    ) -> bool:
        view = self.rows[deployment_id]
        if not precheck(view):
            return False
        self.set_state(deployment_id, "stopped")
        if self.slow_release:
            self.releasing[deployment_id] = view.need_gib
        self.stops.append((view.name, reason))
        return True

    async def budget(self) -> Budget:
        pinned = sum(
            v.need_gib for i, v in self.rows.items() if i in self.always_on and v.state in HOLDING
        )
        return Budget(capacity_gib=self.capacity - pinned, free_gib=self.capacity - self.held())

    async def load(self, deployment_id: int) -> tuple[float, Load] | None:
        if not self.rows[deployment_id].gauged:
            return None  # as the real one: an engine with no gauges gives no sample
        return self.loads.get(deployment_id, (self.clock.now(), Load(0.0, 0.0)))

    async def queue_timed_out(self, deployment_id: int, waited_s: float) -> None:
        self.timeouts.append((deployment_id, waited_s))

    async def hold(self, deployment_id: int, seconds: float) -> bool:
        self.holds.append(deployment_id)
        view = self.rows.get(deployment_id)
        if view is None or view.state != "ready":
            return False
        self.leases[deployment_id] = self.clock.now() + seconds  # what the reaper reads
        return True
