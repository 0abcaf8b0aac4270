"""The GPU ledger on a fake clock (openai_api/usage/gpu_time.py): every second a replica is
under way is divided once among the requests on it, by their work, and booked to the minute
it lies in; what no request was charged is the replica's idle time."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from typing import Any

import pytest

from deployments.models import Deployment
from openai_api.usage import gpu_share, gpu_time
from openai_api.usage.gpu_time import Account, GpuMeter, Ticket, Work

URL = "http://engine"


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Books:
    """What the meter booked: GPU-seconds per (account, minute)."""

    def __init__(self) -> None:
        self.parts: dict[tuple[Account, int], float] = defaultdict(float)

    def __call__(self, account: Account, minute: int, seconds: float) -> None:
        self.parts[(account, minute)] += seconds

    def of(self, name: str) -> float:
        return sum(s for (account, _), s in self.parts.items() if account[2] == name)

    def minute(self, minute: int) -> float:
        return sum(s for (_, m), s in self.parts.items() if m == minute)


def metered() -> tuple[Clock, Books, GpuMeter]:
    clock, books = Clock(), Books()
    return clock, books, GpuMeter(clock, books)


def test_it_divides_a_replicas_time_among_the_requests_on_it_once_all_have_ended() -> None:
    """One GPU, A alone for 2 s, A and B together for 2 s, B alone for 6 s, neither counted
    in tokens (each weighs its presence): A 2 + 1, B 1 + 6, and the two add up to the 10 s
    the GPU served. A's figure is whole only once B, which shared a second with it, ends."""
    clock, books, meter = metered()
    finished: dict[str, float] = {}
    a = meter.begin(URL, 1.0, (1, 0, "a"))
    clock.now = 2.0
    b = meter.begin(URL, 1.0, (2, 0, "b"))
    clock.now = 4.0
    assert meter.end(a, done=lambda s: finished.__setitem__("a", s)) == pytest.approx(2.0)
    assert finished == {}  # the 2 s it shared with B are divided when B ends
    clock.now = 10.0
    assert meter.end(b, done=lambda s: finished.__setitem__("b", s)) == pytest.approx(7.0)
    assert finished == {"a": pytest.approx(3.0), "b": pytest.approx(7.0)}
    assert books.of("a") + books.of("b") == pytest.approx(10.0)
    assert not meter.replicas[URL].ended and not meter.replicas[URL].running


def test_it_charges_a_share_of_a_gpu_and_nothing_where_the_share_is_none() -> None:
    clock, books, meter = metered()
    half = meter.begin(URL, 0.25, (0, 0, "quarter"))  # 20 GiB of an 80 GiB GPU
    clock.now = 4.0
    assert meter.end(half) == pytest.approx(1.0)
    cpu = meter.begin("http://cpu", 0.0, (0, 0, "cpu"))
    clock.now = 9.0
    assert meter.end(cpu) == 0.0
    assert books.of("cpu") == 0.0


def test_it_charges_two_deployments_on_one_gpu_their_shares() -> None:
    """Two 20 GiB models on one 80 GiB GPU, both busy for 10 s: each pays a quarter of the
    GPU's time, not all of it; together what their memory held."""
    clock, books, meter = metered()
    one = meter.begin("http://one", 0.25, (1, 0, "one"))
    two = meter.begin("http://two", 0.25, (1, 0, "two"))
    clock.now = 10.0
    meter.end(one)
    meter.end(two)
    assert books.of("one") == pytest.approx(2.5)
    assert books.of("two") == pytest.approx(2.5)


def lone(meter: GpuMeter, clock: Clock, seconds: float, work: Work) -> float:
    ticket = meter.begin(URL, 1.0, (0, 0, "lone"))
    clock.now += seconds
    return meter.end(ticket, work)


def test_it_divides_by_work_not_presence() -> None:
    """Rates measured on lone streams (100 prompt tokens a second, 10 output tokens a
    second); then two streams share 10 s: one decoded 90 tokens, the other 10. They pay
    by the work each did, not half each."""
    clock, books, meter = metered()
    lone(meter, clock, 2.0, Work(prompt=100, output=11, first_s=1.0))
    assert meter.replicas[URL].prefill_rate == pytest.approx(100.0)
    assert meter.replicas[URL].decode_rate == pytest.approx(10.0)
    busy = meter.begin(URL, 1.0, (1, 0, "busy"))
    light = meter.begin(URL, 1.0, (2, 0, "light"))
    clock.now += 10.0
    meter.end(light, Work(prompt=0, output=10, first_s=0.5))
    meter.end(busy, Work(prompt=0, output=90, first_s=0.5))
    # (Within the 1% a measurement lets the fastest rate decay.)
    assert books.of("busy") == pytest.approx(9.0, rel=0.02)
    assert books.of("light") == pytest.approx(1.0, rel=0.02)
    # A long prompt and a short one in one batch: the prefill is work too.
    long_prompt = meter.begin(URL, 1.0, (3, 0, "long"))
    short = meter.begin(URL, 1.0, (4, 0, "short"))
    clock.now += 10.0
    meter.end(long_prompt, Work(prompt=900, output=10, first_s=9.0))
    meter.end(short, Work(prompt=100, output=10, first_s=1.0))
    # Work 9 + 1 s against 1 + 1 s: 10/12 and 2/12 of the 10 s.
    assert books.of("long") == pytest.approx(10 * 10 / 12, rel=0.05)
    assert books.of("short") == pytest.approx(10 * 2 / 12, rel=0.05)


def test_it_charges_no_slow_reader_or_wait_in_the_engines_queue_as_compute() -> None:
    """Measured at 10 tokens a second, a 20-token answer whose client read it over 30 s is
    charged the 2 s of work it was (the rest is the replica's idle time); one that waited
    8 s in the engine's queue before 2 s of work, likewise."""
    clock, books, meter = metered()
    lone(meter, clock, 2.0, Work(prompt=0, output=21, first_s=0.01))
    before = books.of("lone")
    slow = meter.begin(URL, 1.0, (1, 0, "slow"))
    clock.now += 30.0
    meter.end(slow, Work(prompt=0, output=20, first_s=0.1))
    assert books.of("slow") == pytest.approx(2.0, rel=0.05)
    queued = meter.begin(URL, 1.0, (1, 0, "queued"))
    clock.now += 10.0
    meter.end(queued, Work(prompt=0, output=20, first_s=8.0))
    assert books.of("queued") == pytest.approx(2.0, rel=0.05)
    assert meter.replicas[URL].decode_rate == pytest.approx(10.0, rel=0.05)
    assert before == pytest.approx(2.0)


def test_it_books_each_part_to_the_minute_it_lies_in() -> None:
    """A request from 0:50 to 2:10 is booked 10 s, 60 s and 10 s to its three minutes."""
    clock, books, meter = metered()
    clock.now = 50.0
    ticket = meter.begin(URL, 1.0, (1, 0, "m"))
    clock.now = 130.0
    meter.end(ticket)
    assert dict(books.parts) == {
        ((1, 0, "m"), 0): pytest.approx(10.0),
        ((1, 0, "m"), 60): pytest.approx(60.0),
        ((1, 0, "m"), 120): pytest.approx(10.0),
    }


def busy_within(spans: list[tuple[float, float]], start: float, stop: float) -> float:
    """The time at least one span covers between `start` and `stop`."""
    cuts = sorted({start, stop, *(t for span in spans for t in span if start < t < stop)})
    return sum(
        b - a for a, b in itertools.pairwise(cuts) if any(s <= a and b <= e for s, e in spans)
    )


@pytest.mark.parametrize("seed", range(5))
def test_it_adds_every_minute_up_to_what_the_replica_served(seed: int) -> None:
    """Bursts and idle gaps over ten minutes on a half GPU, requests weighing their presence:
    for every minute, the requests' GPU-seconds are the half GPU's time in it that any
    request was under way, within 1%; with token counts, never more."""
    rng = random.Random(seed)
    for counted in (False, True):
        clock, books, meter = metered()
        events: list[tuple[float, int]] = []
        for n in range(300):
            start = rng.uniform(0, 540) if rng.random() < 0.7 else rng.uniform(100, 130)
            events += [(start, n), (start + rng.expovariate(1 / 8), -n - 1)]
        tickets: dict[int, Ticket] = {}
        spans: dict[int, list[float]] = {}
        for when, n in sorted(events):
            clock.now = when
            if n >= 0:
                tickets[n] = meter.begin(URL, 0.5, (n % 7, 0, "sim"))
                spans[n] = [when]
            else:
                n = -n - 1
                work = Work(rng.randint(0, 400), rng.randint(1, 200), rng.uniform(0.01, 1))
                meter.end(tickets.pop(n), work if counted else None)
                spans[n].append(when)
        assert not meter.replicas[URL].ended
        covered = [(s, e) for s, e in spans.values()]
        for minute in range(0, 720, 60):
            served = 0.5 * busy_within(covered, minute, minute + 60)
            if counted:
                assert books.minute(minute) <= served * 1.01 + 1e-6
            else:
                assert books.minute(minute) == pytest.approx(served, rel=0.01, abs=1e-6)


def test_it_bounds_the_requests_it_keeps_undivided(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a request that runs for an hour, thousands of short ones would wait to be
    divided: past MAX_PENDING the segments so far are divided with it weighing 1, and the
    sum still adds up."""
    monkeypatch.setattr(gpu_time, "MAX_PENDING", 50)
    clock, books, meter = metered()
    long = meter.begin(URL, 1.0, (1, 0, "long"))
    for _ in range(200):
        short = meter.begin(URL, 1.0, (2, 0, "short"))
        clock.now += 1.0
        meter.end(short)
    assert len(meter.replicas[URL].ended) <= 50
    clock.now += 100.0
    meter.end(long)
    assert books.of("long") + books.of("short") == pytest.approx(300.0)
    assert not meter.replicas[URL].ended


def test_it_sizes_a_replicas_share_by_what_it_holds(settings: Any) -> None:
    """num_gpus where set; else its memory over its GPU's (a 20 GiB model on an 80 GiB GPU
    holds a quarter; one split over two GPUs a quarter of each); on a host without GPUs,
    over the memory budget; nothing where its memory is unknown."""
    settings.MSHIP_GPU_INVENTORY = [(0, 80.0), (1, 80.0), (2, 40.0)]
    assert gpu_share.basis() == gpu_share.GPUS

    def shares(replicas: int = 1, **fields: Any) -> tuple[float, ...]:
        row = Deployment(name="m", model="simulated", loader="simulated", **fields)
        return gpu_share.replica_shares(row, replicas)

    assert shares(num_gpus=0.5) == (0.5,)
    assert shares(2, num_gpus=2) == (2.0, 2.0)
    assert shares(memory_gib=20.0) == (0.25,)
    assert shares(2, memory_gib=20.0, gpus=[[0], [2]]) == (0.25, 0.5)
    assert shares(memory_gib=40.0, gpus=[[0, 1]]) == (0.5,)  # 20 GiB on each of two
    assert shares(memory_gib=200.0, gpus=[[2]]) == (1.0,)  # a GPU is the most it holds
    assert shares(num_gpus=0, memory_gib=20.0) == (0.0,)
    settings.MSHIP_GPU_INVENTORY = []
    settings.MSHIP_MEMORY_CAPACITY_GIB = 16
    assert gpu_share.basis() == gpu_share.BUDGET
    assert shares(memory_gib=4.0) == (0.25,)
    assert shares(memory_gib=4.0, learned_gib=8.0) == (0.5,)  # what an OOM taught it


def test_it_books_no_second_twice_where_a_booking_fails() -> None:
    """A booking that raises (the database away) loses its own part, logged; the next
    division books the rest once, and the meter's state stays whole."""
    clock, books = Clock(), Books()
    failures = [1]

    def flaky(account: Account, minute: int, seconds: float) -> None:
        if failures:
            failures.pop()
            raise RuntimeError("the database is away")
        books(account, minute, seconds)

    meter = GpuMeter(clock, flaky)
    for _ in range(3):
        ticket = meter.begin(URL, 1.0, (1, 0, "m"))
        clock.now += 2.0
        meter.end(ticket)
    assert books.of("m") == pytest.approx(4.0)  # the first 2 s lost, none booked twice
    assert not meter.replicas[URL].ended


def test_it_keeps_its_measured_rates_from_an_outlier() -> None:
    """A first byte sooner than a millisecond measures nothing; a measurement raises a
    known rate at most RATE_JUMP times (a count the engine did not cache-discount, a
    gateway saying nonsense), and the rate gives way again by RATE_DECAY."""
    clock, _, meter = metered()
    lone(meter, clock, 2.0, Work(prompt=100, output=11, first_s=1.0))
    lone(meter, clock, 2.0, Work(prompt=10**12, output=10**12, first_s=1e-300))
    replica = meter.replicas[URL]
    assert (replica.prefill_rate, replica.decode_rate) == (pytest.approx(100), pytest.approx(10))
    lone(meter, clock, 2.0, Work(prompt=10**9, output=11, first_s=1.0))
    assert replica.prefill_rate == pytest.approx(100 * gpu_time.RATE_JUMP)
