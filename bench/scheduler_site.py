"""bench/scheduler.py's trace through the site's scheduler (ondemand/scheduler/): the same
controller on the same simulated host, on the real clock time-compressed, asked by N gateway
processes over the owner's socket as `serve --workers N` asks it, against the same trace run
in one process on the same clock.

    .venv/bin/python bench/scheduler_site.py                   # 1 h of trace, 30x, 4 gateways
    .venv/bin/python bench/scheduler_site.py --hours 0.5 --speed 120 --gateways 2

The owner runs in this process: the real `Owner` (its socket, handshake, questions as tasks,
what each link holds) over the bench's controller. Each gateway is a process of its own,
started from this file, with the real link (ondemand/scheduler/client.py): it replays every
Nth request of the trace at its time, asks for a slot with the request's class, holds it for
the request's service time and releases it. One process: the same controller asked
directly, no socket. Both on a clock that runs `--speed` times faster than the wall's, so a
figure in seconds is simulated seconds; the clock's own jitter (a timer's few milliseconds,
times the speed) is the resolution of a wait.

Figures: starts per hour, the share of requests served without waiting (for a start or the
queue), wait p50/p99 per class. The goal (the issue): the gateways' figures the same as one
process's within 5%, or within what one process's second run of the same trace moved them
by (the real clock's own noise: which of two near-simultaneous events comes first), or for a
wait within the clock's resolution.
Exits 1 when a request went unserved or a gateway failed, not for a missed goal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
os.environ.setdefault("MSHIP_SECRET_KEY", secrets.token_hex(32))  # the gateways inherit it

from bench.fleet import percentile  # bench.scheduler sets Django up
from bench.scheduler import (
    AGING_S,
    CLASSES,
    Figures,
    Host,
    HostDeployer,
    Model,
    Request,
    make_models,
    make_trace,
    simulate,
)
from ondemand import registry
from ondemand.controller import Controller
from ondemand.scheduler import client, wire
from ondemand.scheduler.owner import Marks, Owner
from openai_api import access
from openai_api.concurrency import Claim

if TYPE_CHECKING:
    from ondemand.state import Slot, View

TIMER_S = 0.01  # a real timer's jitter under load, as this bench allows for it
GOAL = 0.05


class ScaledClock:
    """The controller's clock, `speed` times the wall's, from a shared start (the kernel's
    monotonic clock is one for every process of a host)."""

    def __init__(self, speed: float, epoch: float) -> None:
        self.speed, self.epoch = speed, epoch

    def now(self) -> float:
        return (time.monotonic() - self.epoch) * self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0) / self.speed)

    async def until(self, when: float) -> None:
        await self.sleep(when - self.now())

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0) / self.speed):
                await event.wait()
            return True
        return False


class Serving(Controller):
    """The controller, with the host told when a granted request runs and ends (the host's
    idle memory counts it), wherever the grant was asked from."""

    def __init__(self, host: Host, clock: ScaledClock) -> None:
        super().__init__(
            HostDeployer(host), clock, queue_timeout_s=86400, max_queued=10**6, aging_s=AGING_S
        )
        self.host = host

    async def acquire(  # type: ignore[override]  # asked with these only
        self, deployment_id: int, hint: View | None = None, priority: int = 0, **more: Any
    ) -> Slot:
        slot = await super().acquire(deployment_id, hint=hint, priority=priority, **more)
        self.host.begin(self.host.models[deployment_id])
        return slot

    def release(self, slot: Slot) -> None:
        self.host.end(self.host.models[slot.deployment_id])
        super().release(slot)


Served = tuple[str, float, bool]  # class, wait (simulated s), whether it waited


def scenario(args: argparse.Namespace) -> tuple[list[Model], list[Request]]:
    rng = random.Random(args.seed)
    models = make_models(rng)
    return models, make_trace(rng, models, args.hours, args.rate)


def view(model: Model) -> dict[str, Any]:
    """What a gateway's route table says of an on-demand model (ondemand.registry.fields_of):
    not ready, so every grant is the controller's."""
    return {
        "id": model.id,
        "name": model.name,
        "state": "stopped",
        "on_demand": True,
        "idle_timeout_s": 300.0,
        "urls": [],
    }


async def replay(
    clock: ScaledClock, trace: list[Request], ask: Any, release: Any, service: Any
) -> list[Served]:
    """Each request at its time: a slot asked, held for its service time, released."""
    served: list[Served] = []

    async def one(request: Request) -> None:
        await clock.until(request.at)
        marks = Marks()
        access.current.set(marks)  # type: ignore[arg-type]
        slot = await ask(request)
        served.append((request.klass, clock.now() - request.at, bool(marks.waited)))
        await service(request)
        release(slot)

    await asyncio.gather(*(one(r) for r in trace))
    return served


async def in_one_process(args: argparse.Namespace) -> tuple[list[Served], Host]:
    models, trace = scenario(args)
    clock = ScaledClock(args.speed, time.monotonic())
    host = Host(clock, models)  # type: ignore[arg-type]
    ctl = Serving(host, clock)
    reaper = asyncio.ensure_future(host.reaper(ctl.notify))

    async def ask(request: Request) -> Slot:
        return await ctl.acquire(request.model, priority=CLASSES[request.klass])

    try:
        served = await replay(clock, trace, ask, ctl.release, lambda r: clock.sleep(r.service_s))
    finally:
        reaper.cancel()
    host.account()
    return served, host


async def through_gateways(args: argparse.Namespace) -> tuple[list[Served], Host]:
    models, _ = scenario(args)
    folder = Path(tempfile.mkdtemp(prefix="ms-bench-", dir="/tmp"))
    path = folder / "scheduler.sock"
    clock = ScaledClock(args.speed, 0.0)  # its start is set once every gateway is ready
    host = Host(clock, models)  # type: ignore[arg-type]
    ctl = Serving(host, clock)
    registry.controller = lambda: ctl  # the owner's questions reach the bench's controller
    ready = asyncio.Event()
    address = [wire.parse(f"unix:{path}")]
    owner = asyncio.ensure_future(Owner(rebuild_s=0.0).run(address, ready.set))
    await ready.wait()
    gateways = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            *("--gateway", str(n), "--of", str(args.gateways), "--socket", str(path)),
            *("--speed", str(args.speed), "--hours", str(args.hours)),
            *("--rate", str(args.rate), "--seed", str(args.seed)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for n in range(args.gateways)
    ]
    for gateway in gateways:  # each has Django loaded and its link up
        assert gateway.stdout is not None
        if await gateway.stdout.readline() != b"ready\n":
            raise SystemExit("a gateway process did not start")
    clock.epoch = time.monotonic() + 0.1
    for gateway in gateways:
        assert gateway.stdin is not None
        gateway.stdin.write(f"{clock.epoch!r}\n".encode())
        await gateway.stdin.drain()
    await clock.until(0.0)
    reaper = asyncio.ensure_future(host.reaper(ctl.notify))
    served: list[Served] = []
    try:
        for gateway in gateways:
            said, _ = await gateway.communicate()
            if gateway.returncode != 0:
                raise SystemExit(f"a gateway process failed ({gateway.returncode})")
            served += [tuple(item) for item in json.loads(said.splitlines()[-1])]
    finally:
        reaper.cancel()
        owner.cancel()
    host.account()
    return served, host


async def gateway(args: argparse.Namespace) -> list[Served]:
    """One gateway process: every Nth request of the trace, through the real link."""
    models, trace = scenario(args)
    by_id = {m.id: m for m in models}
    link = client.Link(wire.parse(f"unix:{args.socket}"))
    async with client.place(link, Claim(0, "warm-up", None, None, None, 0)):
        pass  # the link is up: what is timed is the questions, not the connection
    print("ready", flush=True)
    epoch = float(await asyncio.to_thread(sys.stdin.readline))
    clock = ScaledClock(args.speed, epoch)

    async def ask(request: Request) -> client.RemoteSlot:
        priority = CLASSES[request.klass]
        return await client.slot(link, view(by_id[request.model]), priority, None, None)

    def release(slot: client.RemoteSlot) -> None:
        link.release(slot.id)

    mine = trace[args.gateway :: args.of]
    return await replay(clock, mine, ask, release, lambda r: clock.sleep(r.service_s))


def figures(served: list[Served], host: Host, hours: float) -> dict[str, float]:
    waits = {klass: [s for k, s, _ in served if k == klass] for klass in CLASSES}
    waited = sum(w for _, _, w in served)
    return table(host.figures.starts, waits, waited, hours)


def figures_of(found: Figures, hours: float) -> dict[str, float]:
    """The same figures from bench/scheduler.py's run on its simulated clock."""
    return table(found.starts, found.waits, found.waited_for_start, hours)


def table(
    starts: int, waits: dict[str, list[float]], waited: int, hours: float
) -> dict[str, float]:
    served = sum(len(w) for w in waits.values())
    said = {"starts/h": starts / hours, "served without waiting": 1 - waited / max(served, 1)}
    for klass in CLASSES:
        said[f"{klass} p50 (s)"] = percentile(waits[klass], 50)
        said[f"{klass} p99 (s)"] = percentile(waits[klass], 99)
    return said


def shown_as(name: str, value: float) -> str:
    return f"{value:.1%}" if "without" in name else f"{value:.1f}"


def alike(name: str, ours: float, one: float, again: float, speed: float) -> bool:
    """Within 5% of one process's figure, or within what one process's own second run moved
    it by (the real clock's noise), or for a wait within the clock's resolution."""
    slack = max(GOAL * abs(one), abs(again - one))
    if name.endswith("(s)"):
        slack = max(slack, TIMER_S * speed)
    return abs(ours - one) <= slack


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0, help="simulated time of the trace")
    parser.add_argument("--rate", type=float, default=0.2, help="peak arrivals/s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--speed", type=float, default=30.0, help="simulated s per wall s")
    parser.add_argument("--gateways", type=int, default=4)
    # A gateway process's own arguments (this file starts them).
    parser.add_argument("--gateway", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--of", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gateway is not None:
        print(json.dumps(asyncio.run(gateway(args))), flush=True)
        return 0
    requests = len(scenario(args)[1])
    began = time.perf_counter()
    one = asyncio.run(in_one_process(args))
    again = asyncio.run(in_one_process(args))
    one_s = (time.perf_counter() - began) / 2
    began = time.perf_counter()
    many = asyncio.run(through_gateways(args))
    many_s = time.perf_counter() - began
    print(
        f"scheduler through the site's owner: bench/scheduler.py's host and trace, {args.hours:g} h"
        f" at {args.speed:g}x ({requests} requests, seed {args.seed}); one process"
        f" {one_s:.0f} s (twice), {args.gateways} gateway processes {many_s:.0f} s of wall time"
    )
    print(
        f"| figure | one process | the same again | {args.gateways} gateway processes"
        " | the same | (bench/scheduler.py's simulated clock) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    ones, agains = figures(*one, args.hours), figures(*again, args.hours)
    manys = figures(*many, args.hours)
    simulated = figures_of(simulate("modelship", args)[0], args.hours)
    missed = []
    for name, value in ones.items():
        same = alike(name, manys[name], value, agains[name], args.speed)
        if not same:
            missed.append(name)
        shown = [shown_as(name, v) for v in (value, agains[name], manys[name])]
        cells = [name, *shown, "yes" if same else "no", shown_as(name, simulated[name])]
        print("| " + " | ".join(cells) + " |")
    resolution = TIMER_S * args.speed
    print(
        f"through {args.gateways} gateways against one process, within 5% or one process's"
        f" own spread (a wait: or {resolution:.1f} s, the clock's resolution): "
        + ("met" if not missed else f"missed ({', '.join(missed)})")
    )
    lost = {
        "one process": requests - len(one[0]),
        "again": requests - len(again[0]),
        "gateways": requests - len(many[0]),
    }
    if any(lost.values()):
        print(f"requests never served: {lost}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
