"""The scheduler on a replayed trace: Modelship's (the real controller and make-room code)
against two baselines written here, on one host and one trace, on a simulated clock.

    .venv/bin/python bench/scheduler.py                  # a day, 2 x 80 GiB GPUs, 12 models
    .venv/bin/python bench/scheduler.py --hours 2 --seed 3

The host: two GPUs of 80 GiB; twelve models of 8 to 70 GiB, each placed on one GPU (pack),
each taking 5 to 90 s to start (more for a larger one). The trace (seeded, generated below):
three classes of keys. `high` is interactive chat on the three most popular models; `normal`
spreads over all twelve by popularity (Zipf); `low` is batch jobs, bursts of 20 to 80
requests to one model at once. Rates follow a diurnal curve (night at a fifth of the day's).
Each request holds its model for a service time (exponential, 6 s mean); a loaded model
serves any number at once. Every policy stops a model idle for 5 minutes (Ollama's
keep_alive, llama-swap's ttl) and otherwise loads and stops only as its rule says:

- `modelship`: each request takes a slot from ondemand.controller.Controller with its key's
  class (the queue ordered by class, aged one class per 120 s; make-room stops unused
  models, the cheapest to bring back first, never one of a higher class or loaded less than
  60 s ago while another would do). Engines that cannot sleep (llama.cpp's), so each swap
  back is a start.
- `modelship-sleep`: the same with engines that sleep (vLLM's sleep mode): what make-room and
  the idle timeout put away sleeps, at level 1 (weights in host memory, woken in 1 s plus
  the weights at 20 GiB/s) while a host budget of 256 GiB holds the level-1 sleepers, else
  at level 2 (weights dropped, reloaded at 3 GiB/s); stopped after an hour asleep. A woken
  engine wakes on the GPU it slept on. A wake is not counted as a start; wakes are counted
  apart.
- `fifo-lru` (Ollama's and llama-swap's default behaviour): one queue in arrival order; the
  head is served when its model is loaded, else the model is loaded once it fits, after
  stopping the least recently used models with nothing in flight; the head blocks the rest.
- `fifo-lru-cap`: the same with at most 3 models loaded (OLLAMA_MAX_LOADED_MODELS=3).

Figures per policy: starts per hour (thrash), the share of requests served without waiting
for a start, wait p50/p99 per class, the longest low-class wait, and GPU memory-hours held by
loaded models with nothing in flight. Goals (the issue): at least 2x fewer starts than
fifo-lru, high-class p99 wait at most half of fifo-lru's, no low-class wait above the
starvation bound; each is printed as met or missed. Exits 1 when a policy left a request
unserved (the simulation's own check), not for a missed goal.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
import django

django.setup()

from bench.fleet import SimClock, percentile  # noqa: E402
from deployments import placement  # noqa: E402
from deployments.memory import InsufficientMemory  # noqa: E402
from deployments.placement import Demand, Device  # noqa: E402
from ondemand.controller import Controller  # noqa: E402
from ondemand.state import Budget, View  # noqa: E402

if TYPE_CHECKING:
    from deployments.engine_metrics import Load

GPU_GIB = 80.0
SIZES = (8, 10, 12, 14, 16, 20, 24, 32, 40, 48, 64, 70)
CLASSES = {"high": 10, "normal": 0, "low": -10}
IDLE_TIMEOUT_S = 300.0
SLEEP_HOST_GIB = 256.0
SLEEP_MAX_S = 3600.0
MIN_RESIDENCY_S = 60.0
AGING_S = 120.0
CAP = 3


@dataclass
class Model:
    id: int
    name: str
    gib: float
    start_s: float
    state: str = "stopped"
    device: int | None = None
    inflight: int = 0
    last_used: float = 0.0
    ready_at: float = 0.0
    sleep_level: int = 0
    asleep_at: float = 0.0


@dataclass(order=True)
class Request:
    at: float
    model: int
    klass: str
    service_s: float


@dataclass
class Figures:
    starts: int = 0
    wakes: int = 0
    waits: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CLASSES})
    waited_for_start: int = 0
    idle_gib_s: float = 0.0


class Host:
    """Two GPUs and the models' engines: what every policy loads, stops and serves on."""

    def __init__(self, clock: SimClock, models: list[Model], sleeps: bool = False) -> None:
        self.clock = clock
        self.sleeps = sleeps  # its engines sleep (vLLM) rather than stop
        self.models = {m.id: m for m in models}
        self.figures = Figures()
        self.accounted_at = 0.0

    def account(self) -> None:
        """Memory held by loaded models with nothing in flight, since the last change."""
        now = self.clock.now()
        idle = sum(m.gib for m in self.models.values() if m.state == "ready" and not m.inflight)
        self.figures.idle_gib_s += idle * (now - self.accounted_at)
        self.accounted_at = now

    def devices(self) -> list[Device]:
        used = [0.0, 0.0]
        for m in self.models.values():
            if m.device is not None and m.state != "asleep":
                used[m.device] += m.gib
        return [Device(i, GPU_GIB, GPU_GIB - used[i]) for i in range(2)]

    def place(self, model: Model) -> int | None:
        try:
            return placement.place(Demand(gib=model.gib), self.devices())[0][0]
        except placement.NoRoom:
            return None

    def loaded(self) -> list[Model]:
        return [m for m in self.models.values() if m.state in ("starting", "ready")]

    async def load(self, model: Model, claimed: Any = None) -> None:
        device = self.place(model)
        if device is None:
            raise InsufficientMemory(model.name, model.gib, 0.0, 2 * GPU_GIB)
        self.account()
        model.state, model.device = "starting", device
        self.figures.starts += 1
        if claimed is not None:
            claimed()  # placed: the controller's lock is let go while it loads
        await self.clock.sleep(model.start_s)
        self.account()
        if model.state == "starting":
            model.state, model.ready_at = "ready", self.clock.now()

    def unload(self, model: Model) -> None:
        self.account()
        model.state, model.device = "stopped", None

    def put_away(self, model: Model) -> None:
        """What a swap or the idle timeout does: a sleep where engines sleep, else a stop."""
        if not self.sleeps:
            return self.unload(model)
        self.account()
        kept = sum(
            m.gib for m in self.models.values() if m.state == "asleep" and m.sleep_level == 1
        )
        model.sleep_level = 1 if kept + model.gib <= SLEEP_HOST_GIB else 2
        model.state, model.asleep_at = "asleep", self.clock.now()
        return None

    async def wake(self, model: Model) -> None:
        """On the GPU it slept on only (its CUDA context is there)."""
        assert model.device is not None
        if self.devices()[model.device].free_gib < model.gib:
            raise InsufficientMemory(model.name, model.gib, 0.0, 2 * GPU_GIB)
        self.account()
        model.state = "starting"
        self.figures.wakes += 1
        rate = 20.0 if model.sleep_level == 1 else 3.0
        await self.clock.sleep(1.0 + model.gib / rate)
        self.account()
        if model.state == "starting":
            model.state, model.ready_at = "ready", self.clock.now()

    def begin(self, model: Model) -> None:
        self.account()
        model.inflight += 1
        model.last_used = self.clock.now()

    def end(self, model: Model) -> None:
        self.account()
        model.inflight -= 1
        model.last_used = self.clock.now()

    async def reaper(self, changed: Any = None) -> None:
        """Every policy stops a model idle for IDLE_TIMEOUT_S (checked every 15 s)."""
        while True:
            await self.clock.sleep(15)
            now = self.clock.now()
            for m in self.models.values():
                # From its start too: on a real clock a sweep can come before its first grant.
                idle_s = now - max(m.last_used, m.ready_at)
                if m.state == "ready" and not m.inflight and idle_s >= IDLE_TIMEOUT_S:
                    self.put_away(m)
                elif m.state == "asleep" and now - m.asleep_at >= SLEEP_MAX_S:
                    self.unload(m)
                else:
                    continue
                if changed is not None:
                    changed()


class HostDeployer:
    """The controller's deployer over the host (the Deployer protocol)."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def view_of(self, m: Model) -> View:
        resident = m.state == "ready" and self.host.clock.now() - m.ready_at < MIN_RESIDENCY_S
        return View(
            id=m.id,
            name=m.name,
            state=m.state,
            on_demand=True,
            need_gib=m.gib,
            idle_timeout_s=IDLE_TIMEOUT_S,
            gauged=False,
            demand=Demand(gib=m.gib),
            held=((m.device, m.gib),) if m.device is not None and m.state != "asleep" else (),
            recently_loaded=resident,
            start_s=m.start_s,
            wakes_on=(m.device,) if m.state == "asleep" and m.device is not None else (),
        )

    async def view(self, deployment_id: int) -> View | None:
        return self.view_of(self.host.models[deployment_id])

    async def views(self) -> list[View]:
        return [self.view_of(m) for m in self.host.models.values()]

    async def restart(self, deployment_id: int, claimed: Any = None) -> None:
        await self.host.load(self.host.models[deployment_id], claimed)

    async def wake(self, deployment_id: int) -> None:
        await self.host.wake(self.host.models[deployment_id])

    async def prepare(self, deployment_id: int) -> bool:
        return True

    async def stop(
        self, deployment_id: int, precheck: Any, reason: str, room_for: int | None = None
    ) -> bool:
        model = self.host.models[deployment_id]
        if model.state != "ready" or not precheck(self.view_of(model)):
            return False
        self.host.put_away(model)
        return True

    async def budget(self) -> Budget:
        devices = self.host.devices()
        free = sum(d.free_gib for d in devices)
        return Budget(capacity_gib=2 * GPU_GIB, free_gib=free, devices=tuple(devices))

    async def load(self, deployment_id: int) -> tuple[float, Load] | None:
        return None

    async def hold(self, deployment_id: int, seconds: float) -> bool:
        return self.host.models[deployment_id].state == "ready"

    async def queue_timed_out(self, deployment_id: int, waited_s: float) -> None:
        return None


def make_models(rng: random.Random) -> list[Model]:
    return [
        Model(
            i + 1, f"m{i + 1}-{gib}g", float(gib), min(90.0, 5 + gib * 1.2 * rng.uniform(0.8, 1.1))
        )
        for i, gib in enumerate(SIZES)
    ]


def make_trace(rng: random.Random, models: list[Model], hours: float, rate: float) -> list[Request]:
    """Poisson arrivals thinned by a diurnal curve; popularity by Zipf, shuffled over sizes."""
    order = list(models)
    rng.shuffle(order)
    weights = [1 / (rank + 1) for rank in range(len(order))]
    end, t = hours * 3600, 0.0
    trace: list[Request] = []
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return sorted(trace)
        day = 0.2 + 0.8 * math.sin(math.pi * (t % 86400) / 86400) ** 2
        if rng.random() > day:
            continue
        roll = rng.random()
        if roll < 0.25:
            model = rng.choice(order[:3])
            trace.append(Request(t, model.id, "high", rng.expovariate(1 / 6)))
        elif roll < 0.97:
            model = rng.choices(order, weights)[0]
            trace.append(Request(t, model.id, "normal", rng.expovariate(1 / 6)))
        else:  # a batch job: a burst to one model
            model = rng.choice(order)
            for n in range(rng.randint(20, 80)):
                trace.append(Request(t + n * 0.5, model.id, "low", rng.expovariate(1 / 6)))


async def run_modelship(host: Host, trace: list[Request]) -> None:
    clock = host.clock
    controller = Controller(
        HostDeployer(host), clock, queue_timeout_s=86400, max_queued=10**6, aging_s=AGING_S
    )

    async def serve(request: Request) -> None:
        model = host.models[request.model]
        starts = host.figures.starts
        slot = await controller.acquire(request.model, priority=CLASSES[request.klass])
        record(host, request, starts)
        host.begin(model)
        await clock.sleep(request.service_s)
        host.end(model)
        controller.release(slot)

    await replay(host, trace, serve, controller.notify)


def record(host: Host, request: Request, starts_before: int) -> None:
    host.figures.waits[request.klass].append(host.clock.now() - request.at)
    if host.figures.starts != starts_before or host.clock.now() - request.at > 1e-6:
        host.figures.waited_for_start += 1


async def run_fifo_lru(host: Host, trace: list[Request], cap: int = 0) -> None:
    """The baseline: one queue in arrival order, the least recently used unused model stopped
    until the head's model fits (and, with a cap, until fewer than `cap` are loaded)."""
    clock, queue, changed = (
        host.clock,
        deque[tuple[Request, asyncio.Future[None]]](),
        [asyncio.Event()],
    )

    def wake() -> None:
        changed[0].set()
        changed[0] = asyncio.Event()

    async def scheduler() -> None:
        while True:
            while not queue:
                await changed[0].wait()
            request, granted = queue[0]
            model = host.models[request.model]
            if model.state == "ready":
                queue.popleft()
                granted.set_result(None)
                continue
            if model.state == "stopped":
                over = cap and len(host.loaded()) >= cap
                if host.place(model) is None or over:
                    unused = [m for m in host.loaded() if m.state == "ready" and not m.inflight]
                    if not unused:
                        await changed[0].wait()  # a request ends, a start ends
                        continue
                    host.unload(min(unused, key=lambda m: m.last_used))
                    continue
                await host.load(model)
                continue
            await changed[0].wait()

    async def serve(request: Request) -> None:
        model = host.models[request.model]
        starts = host.figures.starts
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append((request, granted))
        wake()
        await granted
        record(host, request, starts)
        host.begin(model)
        await clock.sleep(request.service_s)
        host.end(model)
        wake()

    spawn(scheduler())
    await replay(host, trace, serve, wake)


_running: set[asyncio.Future[Any]] = set()


def spawn(work: Any) -> None:
    task = asyncio.ensure_future(work)
    _running.add(task)
    task.add_done_callback(_running.discard)


async def replay(host: Host, trace: list[Request], serve: Any, changed: Any) -> None:
    async def arrivals() -> None:
        for request in trace:
            await host.clock.sleep(request.at - host.clock.now())
            spawn(serve(request))

    spawn(arrivals())
    spawn(host.reaper(changed))
    end = (trace[-1].at if trace else 0.0) + 4 * 3600
    await host.clock.run(until=end)
    host.account()


def simulate(policy: str, args: argparse.Namespace) -> tuple[Figures, float, int]:
    rng = random.Random(args.seed)
    models = make_models(rng)
    trace = make_trace(rng, models, args.hours, args.rate)

    async def main() -> Figures:
        host = Host(SimClock(), models, sleeps=policy == "modelship-sleep")
        if policy.startswith("modelship"):
            await run_modelship(host, trace)
        else:
            await run_fifo_lru(host, trace, cap=CAP if policy == "fifo-lru-cap" else 0)
        for task in list(_running):
            task.cancel()
        return host.figures

    began = time.perf_counter()
    figures = asyncio.run(main())
    return figures, time.perf_counter() - began, len(trace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="simulated time")
    parser.add_argument(
        "--rate", type=float, default=0.05, help="peak arrivals/s (a batch burst is one)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    bound = 2 * AGING_S + max(m.start_s for m in make_models(random.Random(args.seed))) + 15
    policies = ("modelship", "modelship-sleep", "fifo-lru", "fifo-lru-cap")
    results = {p: simulate(p, args) for p in policies}
    requests = next(iter(results.values()))[2]
    print(
        f"scheduler: 2 x {GPU_GIB:g} GiB GPUs, {len(SIZES)} models ({min(SIZES)}-{max(SIZES)}"
        f" GiB), {args.hours:g} h simulated, {requests} requests, seed {args.seed};"
        f" starvation bound {bound:.0f} s (2 x aging + the longest start + a poll)"
    )
    print(
        "| policy | starts/h | wakes/h | served without a start | high p50 / p99 (s)"
        " | normal p50 / p99 (s) | low p50 / p99 (s) | longest low wait (s) | idle GPU GiB-h"
        " | wall (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for policy, (figures, wall, _) in results.items():
        waits = figures.waits
        served = sum(len(w) for w in waits.values())
        cells = [
            policy,
            f"{figures.starts / args.hours:.1f}",
            f"{figures.wakes / args.hours:.1f}",
            f"{1 - figures.waited_for_start / max(served, 1):.1%}",
            *(
                f"{percentile(waits[c], 50):.1f} / {percentile(waits[c], 99):.1f}"
                for c in ("high", "normal", "low")
            ),
            f"{max(waits['low'], default=0):.0f}",
            f"{figures.idle_gib_s / 3600:.0f}",
            f"{wall:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")
    fifo = results["fifo-lru"][0]
    for ours_name in ("modelship", "modelship-sleep"):
        ours = results[ours_name][0]
        fewer = fifo.starts / max(ours.starts, 1)
        high = percentile(ours.waits["high"], 99) / max(percentile(fifo.waits["high"], 99), 1e-9)
        longest_low = max(ours.waits["low"], default=0.0)
        goals = (
            (f"{fewer:.2f}x fewer starts (goal >= 2)", fewer >= 2),
            (f"high-class p99 wait {high:.2f}x (goal <= 0.5)", high <= 0.5),
            (
                f"longest low-class wait {longest_low:.0f} s (goal <= {bound:.0f} s)",
                longest_low <= bound,
            ),
        )
        said = ", ".join(f"{text}: {'met' if met else 'missed'}" for text, met in goals)
        print(f"{ours_name} against fifo-lru: {said}")
    lost = {p: n - sum(map(len, f.waits.values())) for p, (f, _, n) in results.items()}
    if any(lost.values()):
        print(f"requests never served: {lost}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
