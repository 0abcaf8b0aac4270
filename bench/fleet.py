"""A simulated fleet for planning: the real on-demand controller, GPU placement and autoscaling
decision against a simulated cluster, on a simulated clock.

    .venv/bin/python bench/fleet.py                  # 10 nodes x 8 GPUs, 100 models, a day
    .venv/bin/python bench/fleet.py --hours 1 --deployments 20

The cluster is the nodes' GPUs as one inventory (each start is placed by
deployments/placement.py, pack policy; a tensor-parallel model takes whole GPUs). The trace
is Poisson arrivals per model: a few hot models (autoscaled, `--hot`), many cold ones with
rates spread over two orders of magnitude. Each request takes a slot from the controller
(which starts, queues and makes room as it does in the gateway), holds it for its service
time and gives it back; engines take a start time that grows with their size. Every minute
an idle model is stopped as the reaper would; every 5 s the autoscaler's decision
(deployments/autoscaling.py) sets the hot models' replicas, each placed like a start.

Time is simulated: a discrete-event loop runs every coroutine until none can go on, then
moves the clock to the next timer. Reported: cold starts, queue waits (p50, p99), make-room
stops, GPU memory in use over the day, controller decisions per second of wall time.
Exits 1 when a request was refused for a reason a fleet of this size should not have
(a start failure, a model that can never fit).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
import django

django.setup()

from deployments import placement  # noqa: E402
from deployments.autoscaling import AutoscalingConfig, Decider  # noqa: E402
from deployments.memory import InsufficientMemory  # noqa: E402
from deployments.placement import Demand, Device  # noqa: E402
from ondemand.controller import Controller  # noqa: E402
from ondemand.state import Budget, View  # noqa: E402
from openai_api.errors import GatewayError  # noqa: E402

if TYPE_CHECKING:
    from deployments.engine_metrics import Load


class SimClock:
    """The controller's clock, moved by the simulation loop from one timer to the next."""

    def __init__(self) -> None:
        self.t = 0.0
        self.timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self.seq = itertools.count()

    def now(self) -> float:
        return self.t

    def at(self, when: float) -> asyncio.Future[None]:
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.timers, (max(when, self.t), next(self.seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        await self.at(self.t + seconds)

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
        if event.is_set():
            return True
        timer = self.at(self.t + timeout)
        woken = asyncio.ensure_future(event.wait())
        try:
            either: set[asyncio.Future[Any]] = {timer, woken}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            timer.cancel()
        return woken.done() and not woken.cancelled()

    async def run(self, until: float) -> None:
        """Let every coroutine run until none can go on, then move to the next timer."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0)
            # asyncio's queue of ready callbacks: empty once nothing but timers is left.
            if loop._ready:  # type: ignore[attr-defined]
                continue
            while self.timers and self.timers[0][2].done():
                heapq.heappop(self.timers)  # cancelled
            if not self.timers or self.timers[0][0] > until:
                return
            when, _, timer = heapq.heappop(self.timers)
            self.t = when
            timer.set_result(None)


@dataclass
class Model:
    id: int
    name: str
    demand: Demand
    start_s: float
    rate_per_s: float
    service_s: float
    scaling: AutoscalingConfig | None = None
    state: str = "stopped"
    # Each replica's (device, GiB) holdings.
    replicas: list[list[tuple[int, float]]] = field(default_factory=list)

    @property
    def need_gib(self) -> float:
        return self.demand.replicas * self.demand.devices * (self.demand.gib or 0.0)


@dataclass
class Figures:
    waits: list[float] = field(default_factory=list)
    cold_starts: int = 0
    make_room_stops: int = 0
    reaper_stops: int = 0
    scale_steps: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    memory_use: list[float] = field(default_factory=list)
    decisions: int = 0


class Fleet:
    """The controller's deployer: the cluster's GPUs, engines that start in simulated time."""

    def __init__(
        self, clock: SimClock, devices: list[Device], models: list[Model], idle_timeout_s: float
    ) -> None:
        self.clock = clock
        self.idle_timeout_s = idle_timeout_s
        self.total = {d.index: d.total_gib for d in devices}
        self.models = {m.id: m for m in models}
        self.figures = Figures()

    def held(self, but: int | None = None) -> dict[int, float]:
        used = dict.fromkeys(self.total, 0.0)
        for model in self.models.values():
            if model.id == but:
                continue
            for replica in model.replicas:
                for index, gib in replica:
                    used[index] += gib
        return used

    def devices(self, but: int | None = None) -> list[Device]:
        used = self.held(but)
        return [Device(i, total, total - used[i]) for i, total in self.total.items()]

    def view_of(self, model: Model) -> View:
        return View(
            id=model.id,
            name=model.name,
            state=model.state,
            on_demand=True,
            need_gib=model.need_gib,
            idle_timeout_s=self.idle_timeout_s,
            demand=model.demand,
            held=tuple(h for replica in model.replicas for h in replica),
        )

    async def view(self, deployment_id: int) -> View | None:
        return self.view_of(self.models[deployment_id])

    async def views(self) -> list[View]:
        return [self.view_of(m) for m in self.models.values()]

    def place(self, model: Model, replicas: int, but: int | None = None) -> list[list[int]]:
        demand = replace(model.demand, replicas=replicas)
        try:
            return placement.place(demand, self.devices(but))
        except placement.NoRoom as exc:
            raise InsufficientMemory(model.name, model.need_gib, 0.0, 0.0) from exc

    async def restart(self, deployment_id: int, claimed: Any = None) -> None:
        model = self.models[deployment_id]
        self.figures.decisions += 1
        count = model.scaling.initial if model.scaling else model.demand.replicas
        placed = self.place(model, count, but=model.id)
        gib = model.demand.gib or 0.0
        model.replicas = [[(i, gib) for i in devices] for devices in placed]
        model.state = "starting"
        if claimed is not None:
            claimed()  # its memory is held: the controller's lock is let go
        self.figures.cold_starts += 1
        await self.clock.sleep(model.start_s)
        if model.state == "starting":
            model.state = "ready"

    async def wake(self, deployment_id: int) -> None:
        await self.restart(deployment_id)

    async def prepare(self, deployment_id: int) -> bool:
        return True  # images and engine environments are there

    async def stop(
        self, deployment_id: int, precheck: Any, reason: str, room_for: int | None = None
    ) -> bool:
        model = self.models[deployment_id]
        self.figures.decisions += 1
        if model.state != "ready" or not precheck(self.view_of(model)):
            return False
        model.state, model.replicas = "stopped", []
        if "make room" in reason:
            self.figures.make_room_stops += 1
        return True

    async def budget(self) -> Budget:
        devices = self.devices()
        return Budget(
            capacity_gib=sum(self.total.values()),
            free_gib=sum(d.free_gib for d in devices),
            devices=tuple(devices),
        )

    async def load(self, deployment_id: int) -> tuple[float, Load] | None:
        return None  # no gauges: the controller's slots decide, as for any such engine

    async def hold(self, deployment_id: int, seconds: float) -> bool:
        return self.models[deployment_id].state == "ready"

    async def queue_timed_out(self, deployment_id: int, waited_s: float) -> None:
        return None


def make_models(args: argparse.Namespace, rng: random.Random, gpu_gib: float) -> list[Model]:
    models = []
    for i in range(args.deployments):
        hot = i < args.hot
        size = rng.choices(["quarter", "half", "one", "two", "four"], [30, 25, 30, 10, 5])[0]
        devices = {"two": 2, "four": 4}.get(size, 1)
        share = {"quarter": 0.25, "half": 0.5}.get(size, 0.9)
        demand = Demand(replicas=1, devices=devices, gib=share * gpu_gib)
        models.append(
            Model(
                id=i + 1,
                name=f"{'hot' if hot else 'cold'}-{i + 1}",
                demand=demand,
                start_s=15.0 + 25.0 * devices * share * rng.uniform(0.8, 1.6),
                # Hot: a request every two seconds; cold: one an hour to one a minute.
                rate_per_s=args.hot_rate if hot else 10 ** rng.uniform(-3.6, -1.8),
                service_s=rng.uniform(1.0, 6.0),
                scaling=AutoscalingConfig(
                    min_replicas=1,
                    max_replicas=4,
                    target_ongoing_requests=2,
                    upscale_delay_s=30,
                    downscale_delay_s=600,
                )
                if hot
                else None,
            )
        )
    return models


async def simulate(args: argparse.Namespace) -> tuple[Figures, float, int]:
    rng = random.Random(args.seed)
    clock = SimClock()
    devices = [
        Device(n * args.gpus + g, args.gpu_gib, args.gpu_gib)
        for n in range(args.nodes)
        for g in range(args.gpus)
    ]
    models = make_models(args, rng, args.gpu_gib)
    fleet = Fleet(clock, devices, models, args.idle_timeout)
    controller = Controller(fleet, clock, queue_timeout_s=900, max_queued=100_000)
    end = args.hours * 3600.0
    figures = fleet.figures
    requests = 0
    running: set[asyncio.Future[None]] = set()

    def spawn(work: Any) -> None:
        task = asyncio.ensure_future(work)
        running.add(task)
        task.add_done_callback(running.discard)

    async def request(model: Model, arrived: float) -> None:
        try:
            slot = await controller.acquire(model.id)
        except GatewayError as exc:
            figures.refused[exc.code] = figures.refused.get(exc.code, 0) + 1
            return
        figures.waits.append(clock.now() - arrived)
        await clock.sleep(rng.expovariate(1.0 / model.service_s))
        controller.release(slot)

    async def arrivals(model: Model) -> None:
        nonlocal requests
        while True:
            await clock.sleep(rng.expovariate(model.rate_per_s))
            if clock.now() >= end:
                return
            requests += 1
            figures.decisions += 1
            spawn(request(model, clock.now()))

    async def reaper() -> None:
        while True:
            await clock.sleep(60)
            for model in models:
                idle = model.state == "ready" and controller._still_idle(fleet.view_of(model))
                if idle and await fleet.stop(model.id, controller._still_idle, "idle"):
                    figures.reaper_stops += 1
            controller.notify()

    async def autoscaler() -> None:
        decider = Decider()
        while True:
            await clock.sleep(5)
            for model in models:
                if model.scaling is None or model.state != "ready":
                    continue
                entry = controller.entry(model.id)
                ongoing = float(entry.inflight + entry.queued)
                running = len(model.replicas)
                target = decider.decide(model.id, model.scaling, running, ongoing, clock.now())
                if target is None:
                    continue
                figures.decisions += 1
                if target > running:
                    try:
                        placed = fleet.place(model, target - running)
                    except InsufficientMemory:
                        continue
                    gib = model.demand.gib or 0.0
                    model.replicas += [[(i, gib) for i in devs] for devs in placed]
                else:
                    del model.replicas[target:]
                figures.scale_steps += 1

    async def sample_memory() -> None:
        capacity = sum(fleet.total.values())
        while True:
            figures.memory_use.append(sum(fleet.held().values()) / capacity)
            await clock.sleep(300)

    for model in models:
        spawn(arrivals(model))
    for loop in (reaper(), autoscaler(), sample_memory()):
        spawn(loop)
    began = time.perf_counter()
    await clock.run(until=end + 3600)
    return figures, time.perf_counter() - began, requests


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--gpu-gib", type=float, default=80.0)
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--hot", type=int, default=5, help="hot models (autoscaled)")
    parser.add_argument("--hot-rate", type=float, default=0.5, help="a hot model's requests/s")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated time")
    parser.add_argument("--idle-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    figures, wall, requests = asyncio.run(simulate(args))
    use = figures.memory_use
    print(
        f"fleet: {args.nodes} nodes x {args.gpus} GPUs of {args.gpu_gib:g} GiB,"
        f" {args.deployments} models ({args.hot} hot, autoscaled), {args.hours:g} h simulated,"
        f" idle timeout {args.idle_timeout:g} s"
    )
    print(f"  requests: {requests} ({len(figures.waits)} served, refused {figures.refused or 0})")
    print(
        f"  queue waits: p50 {percentile(figures.waits, 50):.2f} s,"
        f" p99 {percentile(figures.waits, 99):.2f} s, max {max(figures.waits, default=0):.1f} s"
    )
    print(
        f"  cold starts: {figures.cold_starts}, make-room stops: {figures.make_room_stops},"
        f" idle stops: {figures.reaper_stops}, autoscaling steps: {figures.scale_steps}"
    )
    if use:
        hourly = [max(use[i : i + 12]) for i in range(0, len(use), 12)]
        print(
            f"  GPU memory in use: mean {statistics.mean(use):.0%}, max {max(use):.0%};"
            f" hourly peaks: {' '.join(f'{u:.0%}' for u in hourly)}"
        )
    print(
        f"  wall time: {wall:.1f} s ({args.hours * 3600 / wall:,.0f} simulated s per s),"
        f" {figures.decisions / wall:,.0f} decisions/s"
    )
    bad = {k: v for k, v in figures.refused.items() if k != "ondemand_queue_timeout"}
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
