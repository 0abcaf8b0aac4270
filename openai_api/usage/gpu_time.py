"""GPU-seconds: one ledger of each replica's time, divided among the requests it served by
their work (README, "Usage and budgets").

A replica's time is cut into segments at every request's start and end on it (and at each
minute's start while one is under way). A segment with requests on the engine is divided
among them by weight; a segment without is idle. A request's weight is the part of its time
it kept the engine busy, by its own token counts and the rates the replica was measured at:

    work(r)   = computed prompt tokens(r) / prefill rate + output tokens(r) / decode rate
    weight(r) = min(1, work(r) / its time on the engine)
    part(r, segment) = share * length(segment) * weight(r) / max(1, sum of weights in it)

so requests that together keep the engine busy divide its whole time by the work each did,
while the time a request only waited (in the engine's queue, for a slow client reading its
stream) is charged to no one: it is the deployment's idle account (held less loading less
what requests were charged; openai_api/usage/report.py). The rates are the replica's fastest
seen, decaying by RATE_DECAY per measurement (a streamed answer's first byte measures its
prefill, the rest its decode); until a rate is known, and for a request without token counts
(images, audio), the weight is 1: it is charged its presence.

A segment is divided once every request in it has ended (their counts are known then), and
each part is booked (`book`) to the minute the segment lies in, so for every replica and
minute the requests' GPU-seconds plus idle add up to what it held. Where several gateway
processes or hosts send requests to one replica, one meter divides: the site scheduler's
owner's (ondemand/scheduler/), told each request's start and end by the gateway that served
it; a process meters on its own only where no owner answers when the request starts."""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from openai_api.catalog import Snapshot

log = logging.getLogger(__name__)
RATE_DECAY = 0.99  # a replica's fastest measured rate gives way by 1% per measurement
RATE_JUMP = 4.0  # one measurement raises a known rate at most this many times
MIN_FIRST_S = 0.001  # a first byte sooner measures nothing (a clock's grain, an odd count)
MAX_FIRST_S = 86_400.0
MINUTES_CUT = 1_440  # minute starts cut into one gap at most (a clock set a year ahead)
MAX_REPLICAS = 4_096  # replicas kept; past it, those with nothing under way are forgotten
# Ended requests a replica keeps undivided while an earlier one is under way; past it, the
# segments so far are divided with the requests under way weighing 1 (a bound, not a rule).
MAX_PENDING = 10_000
Account = tuple[int, int, str]  # key id (0: none), team id (0: none), deployment


@dataclass(slots=True)
class Work:
    """What a request had the engine do, by the engine's counts."""

    prompt: int = 0  # prompt tokens computed (the cached ones not)
    output: int = 0
    first_s: float | None = None  # a stream's seconds to its first byte (None: not a stream)


@dataclass(slots=True, eq=False)
class Request:
    account: Account
    first: int  # its first segment's index
    began: float
    end: int = -1  # its segments end before this index (-1: under way)
    weight: float = 1.0
    spent: float = 0.0  # GPU-seconds divided to it so far
    done: Callable[[float], None] | None = None  # told its whole figure once divided
    whole: bool = False  # its every segment divided and its parts booked


@dataclass(slots=True)
class Replica:
    """One replica's ledger. Segment k runs from starts[k - base] to the next start; a
    request is in segments first to end - 1. `diff` holds each segment's change in the sum
    of its requests' weights (a request's +weight at its first, -weight at its end, said as
    it ends); `cum`, the GPU-seconds per unit of weight of the divided segments, summed up
    to each one's start (from base); `level`, the sum of weights where division stands. A
    request's part is then its weight times the difference of two sums, per minute: each
    request is visited once, as it ends and once divided."""

    share: float = 0.0
    base: int = 0  # the index of starts[0]
    starts: list[float] = field(default_factory=list)  # each segment's start time
    shares: list[float] = field(default_factory=list)  # the replica's share in each
    diff: list[float] = field(default_factory=list)
    cum: list[float] = field(default_factory=lambda: [0.0])
    divided: int = 0  # segments before this one are divided
    level: float = 0.0
    marks: list[int] = field(default_factory=list)  # segments whose start is a new minute
    # Under way, in the order they began (the oldest first: its first segment is the one
    # division waits at); ended and not divided yet, a heap by end, and the same by first
    # (those whole since are dropped from it as it is read: what trim keeps is theirs).
    running: dict[int, Request] = field(default_factory=dict)
    ended: list[tuple[int, int, Request]] = field(default_factory=list)
    by_first: list[tuple[int, int, Request]] = field(default_factory=list)
    order: Iterator[int] = field(default_factory=itertools.count)
    prefill_rate: float | None = None  # tokens a second
    decode_rate: float | None = None

    def add(self, start: float) -> None:
        if self.starts and int(start // 60) != int(self.starts[-1] // 60):
            self.marks.append(self.base + len(self.starts))
        self.starts.append(start)
        self.shares.append(self.share)
        self.diff.append(0.0)

    def cut(self, now: float) -> int:
        """A segment starts at `now` (a minute's start before it, where requests were under
        way across it): its index."""
        if not self.starts:
            self.add(now)
            return self.base
        last = self.starts[-1]
        now = max(now, last)  # a clock set back: no segment of negative length
        if self.running:
            minute = (math.floor(last / 60) + 1) * 60
            for _ in range(MINUTES_CUT):
                if minute >= now:
                    break
                self.add(float(minute))
                minute += 60
        if now > self.starts[-1]:
            self.add(now)
        return self.base + len(self.starts) - 1

    def weigh(self, request: Request, low: int, high: int) -> None:
        """The request weighs its weight in segments low to high - 1."""
        self.diff[low - self.base] += request.weight
        if high - self.base < len(self.diff):
            self.diff[high - self.base] -= request.weight

    def divide_to(self, frontier: int) -> None:
        """The segments up to `frontier` divided: their sums per unit of weight."""
        total = self.cum[-1]
        for index in range(self.divided - self.base, frontier - self.base):
            self.level += self.diff[index]
            if self.level > 1e-12:
                length = self.starts[index + 1] - self.starts[index]
                total += self.shares[index] * length / max(1.0, self.level)
            self.cum.append(total)
        self.divided = max(self.divided, frontier)

    def parts(self, request: Request, low: int, high: int) -> list[tuple[int, float]]:
        """The request's GPU-seconds in divided segments low to high - 1, per minute."""
        found = []
        at = bisect.bisect_right(self.marks, low)
        while low < high:
            stop = min(high, self.marks[at]) if at < len(self.marks) else high
            part = request.weight * (self.cum[stop - self.base] - self.cum[low - self.base])
            if part > 0:
                found.append((int(self.starts[low - self.base] // 60) * 60, part))
            low, at = stop, at + 1
        return found

    def trim(self) -> None:
        """Segments no request needs any more let go: those before the first segment of the
        oldest request under way and of every one ended and not whole."""
        while self.by_first and self.by_first[0][2].whole:
            heapq.heappop(self.by_first)
        oldest = next(iter(self.running.values()), None)
        keep = min(self.divided, oldest.first if oldest is not None else self.divided)
        if self.by_first:
            keep = min(keep, self.by_first[0][0])
        drop = keep - self.base
        if drop > 0:
            del self.starts[:drop], self.shares[:drop], self.diff[:drop], self.cum[:drop]
            self.base = keep
            cut = bisect.bisect_right(self.marks, keep)
            del self.marks[:cut]

    def measured(self, work: Work, seconds: float) -> None:
        """The replica's rates, from a stream's first byte and the rest."""
        first = work.first_s
        if first is None or not MIN_FIRST_S <= first <= MAX_FIRST_S:
            return
        if work.prompt > 0:
            self.prefill_rate = fastest(self.prefill_rate, work.prompt / first)
        if work.output > 1 and seconds - first >= MIN_FIRST_S:
            self.decode_rate = fastest(self.decode_rate, (work.output - 1) / (seconds - first))

    def weight(self, work: Work | None, seconds: float) -> float:
        if work is None or seconds <= 0:
            return 1.0
        busy = 0.0
        for tokens, rate in ((work.prompt, self.prefill_rate), (work.output, self.decode_rate)):
            if tokens:
                if not rate:
                    return 1.0  # not measured yet: charged its presence
                busy += tokens / rate
        return min(1.0, busy / seconds)


def fastest(rate: float | None, seen: float) -> float:
    """The fastest rate seen, giving way by RATE_DECAY; one measurement raises it at most
    RATE_JUMP times (an outlier, a cache hit the engine did not report, moves it little)."""
    if rate is None:
        return seen
    return max(min(seen, rate * RATE_JUMP), rate * RATE_DECAY)


def tally(
    booked: dict[tuple[Account, int], float], request: Request, parts: list[tuple[int, float]]
) -> float:
    """A request's parts added to what a division books, per account and minute: their sum."""
    total = 0.0
    for minute, part in parts:
        place = (request.account, minute)
        booked[place] = booked.get(place, 0.0) + part
        total += part
    return total


class Ticket:
    """A request under way on a replica."""

    __slots__ = ("replica", "request")

    def __init__(self, replica: Replica, request: Request) -> None:
        self.replica, self.request = replica, request


class GpuMeter:
    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        book: Callable[[Account, int, float], None] | None = None,
    ) -> None:
        self.clock = clock
        self.book = book  # None: the parts are only added to each request's figure
        self.replicas: dict[str, Replica] = {}
        self.shares: dict[str, float] = {}
        self.seen: object = None  # the route table the shares were read from

    def share_of(self, url: str, snapshot: Snapshot | None) -> float:
        """The GPU share of the replica at `url` (an engine base URL), by the route table."""
        if snapshot is not None and snapshot is not self.seen:
            self.read_shares(snapshot)
        return self.shares.get(url, 0.0)

    def begin(self, url: str, share: float, account: Account = (0, 0, "")) -> Ticket:
        """A request starts on the replica at `url`, which holds `share` of a GPU."""
        replica = self.replicas.get(url)
        if replica is None:
            if len(self.replicas) >= MAX_REPLICAS:
                self.forget_idle()
            replica = self.replicas[url] = Replica(share)
        now = self.clock()
        index = replica.cut(now)
        replica.share = replica.shares[index - replica.base] = share  # from here on
        request = Request(account, index, now)
        replica.running[id(request)] = request
        return Ticket(replica, request)

    def end(
        self,
        ticket: Ticket,
        work: Work | None = None,
        done: Callable[[float], None] | None = None,
    ) -> float:
        """The request left the engine, having done `work` (None: not counted, it weighs 1).
        Returns what is divided to it so far; `done` is told its whole figure once every
        request it shared a segment with has ended too (at once where none is under way)."""
        replica, request = ticket.replica, ticket.request
        if request.end >= 0:
            return request.spent  # ended already (a link that ended after its end)
        now = self.clock()
        request.end = replica.cut(now)
        seconds = now - request.began
        if work is not None:
            replica.measured(work, seconds)
        request.weight = replica.weight(work, seconds)
        oldest = next(iter(replica.running.values()))
        del replica.running[id(request)]
        if request.end == request.first:  # it spanned no time: nothing to divide
            if done is not None:
                done(0.0)
            return 0.0
        request.done = done
        replica.weigh(request, request.first, request.end)
        heapq.heappush(replica.ended, (request.end, next(replica.order), request))
        heapq.heappush(replica.by_first, (request.first, next(replica.order), request))
        if request is oldest or len(replica.ended) > MAX_PENDING:
            # Division waits at the oldest request under way's first segment: only its end
            # moves that (or the bound on what waits, with those under way weighing 1).
            self.divide(replica, provisional=len(replica.ended) > MAX_PENDING)
        if request.end > replica.divided:
            # Not whole yet: what the segments divided so far give it (its log line's).
            upto = max(request.first, replica.divided)
            return request.spent + sum(p for _, p in replica.parts(request, request.first, upto))
        return request.spent

    def divide(self, replica: Replica, provisional: bool = False) -> None:
        """Divide every segment no request under way is in (`provisional`: every closed one,
        those under way weighing 1 in them), and book the parts of the requests whose
        segments are all divided."""
        last = replica.base + len(replica.starts) - 1  # the open segment
        oldest = next(iter(replica.running.values()), None)
        frontier = last if provisional or oldest is None else oldest.first
        booked: dict[tuple[Account, int], float] = {}
        under_way = list(replica.running.values()) if provisional else []
        for request in under_way:
            weight, request.weight = request.weight, 1.0
            replica.weigh(request, request.first, frontier)
            request.weight = weight
        replica.divide_to(frontier)
        for request in under_way:
            kept, request.weight = request.weight, 1.0
            request.spent += tally(booked, request, replica.parts(request, request.first, frontier))
            request.weight, request.first = kept, frontier  # divided up to here
        finished = []
        while replica.ended and replica.ended[0][0] <= replica.divided:
            request = heapq.heappop(replica.ended)[2]
            parts = replica.parts(request, request.first, request.end)
            request.spent += tally(booked, request, parts)
            request.whole = True
            finished.append(request)
        replica.trim()
        # Booked and told once the ledger's state is whole: a booking that fails loses its
        # part (logged), never books another twice.
        if self.book is not None:
            for (account, minute), part in booked.items():
                try:
                    self.book(account, minute, part)
                except Exception:
                    log.exception("GPU-seconds of %s not booked", account[2])
        for request in finished:
            if request.done is not None:
                request.done(request.spent)

    def forget_idle(self) -> None:
        """Replicas with nothing under way or undivided are forgotten (their measured rates
        with them)."""
        for url, replica in list(self.replicas.items()):
            if not replica.running and not replica.ended:
                del self.replicas[url]

    def read_shares(self, snapshot: Snapshot) -> None:
        """Each replica's share from a new route table; a replica no route points at any
        more, with nothing under way or undivided, is forgotten."""
        self.seen = snapshot
        self.shares = {
            url: share
            for route in snapshot.models
            for url, share in zip(route.urls, route.gpu_shares, strict=False)
        }
        for url, replica in list(self.replicas.items()):
            if url not in self.shares and not replica.running and not replica.ended:
                del self.replicas[url]


class SiteShare(Protocol):
    """A request's part of a replica's GPU time on the site's meter."""

    async def spent(self, work: Work | None) -> float | None:
        """The request ended having done `work`: its GPU-seconds divided so far by the
        site's meter, which books them (None: the owner did not say)."""
        ...


class SiteMeter(Protocol):
    """The site's meter where this process is one of several: the on-demand app registers
    it at start-up (this package imports nothing of it)."""

    def begin(self, url: str, share: float, account: Account) -> SiteShare | None:
        """None: no owner answers; this process meters the request itself."""
        ...


meter = GpuMeter()
site: SiteMeter | None = None
