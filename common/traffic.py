"""Requests and tokens per second over the last 15 minutes, for the admin's dashboard: the
gateway's own counters (common/metrics.py), summed over every process of the site from the
files they record into, sampled every SAMPLE_S by a thread of each serving process. No
external service: the chart works on a site without a Prometheus.

Only the counters' files are read (not the histograms', the bulk of them), once per sample,
off the event loop."""

from __future__ import annotations

import collections
import glob
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)
SAMPLE_S = 10.0
WINDOW_S = 15 * 60.0


class Totals(NamedTuple):
    requests: float
    tokens: float


class Sample(NamedTuple):
    at: float  # wall time
    totals: Totals


def read_totals(folder: str | None = None) -> Totals:
    """The site's requests and tokens (in and out) answered so far, over every process."""
    folder = folder or os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    files = glob.glob(os.path.join(folder, "counter_*.db")) if folder else []
    requests = tokens = 0.0
    for metric in MultiProcessCollector.merge(files, accumulate=True):  # type: ignore[no-untyped-call]
        for sample in metric.samples:
            if sample.name == "modelship_requests_total":
                requests += sample.value
            elif sample.name == "modelship_tokens_total":
                tokens += sample.value
    return Totals(requests, tokens)


class Traffic:
    """The samples of the last WINDOW_S, and the rates between them."""

    def __init__(
        self, read: Callable[[], Totals] = read_totals, clock: Callable[[], float] = time.time
    ) -> None:
        self.read = read
        self.clock = clock
        self.samples: collections.deque[Sample] = collections.deque(
            maxlen=int(WINDOW_S / SAMPLE_S) + 1
        )
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def sample(self) -> None:
        try:
            totals = self.read()
        except Exception:  # a file being written as it is read: the next sample will do
            log.debug("the traffic sample was not read", exc_info=True)
            return
        self.samples.append(Sample(self.clock(), totals))

    def series(self) -> list[dict[str, float]]:
        """Per interval between samples: its end (wall time) and the rates over it. A
        counter that went down (the site restarted and its files were emptied) counts from
        zero again."""
        points = list(self.samples)
        found = []
        for before, after in itertools.pairwise(points):
            span = after.at - before.at
            if span <= 0:
                continue
            rates = [
                max(0.0, now - then) / span
                for then, now in zip(before.totals, after.totals, strict=True)
            ]
            found.append(
                {"at": round(after.at, 1), "rps": round(rates[0], 3), "tps": round(rates[1], 1)}
            )
        return found

    def start(self) -> None:
        """Sample from now on, in a daemon thread (once per process)."""
        with self.lock:
            if self.thread is not None:
                return
            self.thread = threading.Thread(target=self.run, name="modelship-traffic", daemon=True)
            self.thread.start()

    def run(self) -> None:
        while True:
            self.sample()
            time.sleep(SAMPLE_S)


traffic = Traffic()
