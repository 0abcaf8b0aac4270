"""The autoscaler: every MSHIP_AUTOSCALE_INTERVAL_S, each ready deployment with an
`autoscaling_config` gets the replicas its load asks for (deployments/autoscaling.py).

Its load is what its replicas run and queue: the engines' own gauges where the loader
serves them, else the gateway's in-flight count, summed over this host's gateway processes
(the multiprocess metrics). Steps go through scaling.py: up within the memory budget (a
refusal is an event, and the autoscaler tries again at its next look), down one idle
replica at a time. Scaling to zero is not its business: with min_replicas 0 the deployment
is on demand, and the reaper and the controller stop and start it.

`serve` runs it in a thread; it blocks (HTTP to engines, the ORM, launches).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import httpx
from django.conf import settings
from django.db import close_old_connections
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from deployments import engine_secrets, scaling
from deployments.autoscaling import AutoscalingConfig, Decider
from deployments.engine_metrics import replicas_load
from deployments.loaders import get_loader
from deployments.memory import InsufficientMemory
from deployments.models import Deployment, State
from deployments.runtimes import EngineUnreachable

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

log = logging.getLogger(__name__)
INFLIGHT = "modelship_inflight_requests"


def gateway_inflight() -> dict[str, float]:
    """Requests each deployment's engines answer now, by the gateway processes of this host."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(settings.MSHIP_METRICS_DIR))  # type: ignore[no-untyped-call]
    found: dict[str, float] = {}
    for metric in registry.collect():
        if metric.name == INFLIGHT:
            for sample in metric.samples:
                name = sample.labels.get("deployment", "")
                found[name] = found.get(name, 0.0) + sample.value
    return found


class Autoscaler:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.decider = Decider()

    def tick(self) -> list[str]:
        """One look at every autoscaled deployment; returns what it changed, as sentences."""
        done: list[str] = []
        inflight = gateway_inflight()
        scaled = Deployment.objects.filter(state=State.READY, autoscaling_config__isnull=False)
        seen = set()
        with httpx.Client(timeout=2.0) as client:
            for deployment in scaled:
                config = AutoscalingConfig.of(deployment.autoscaling_config)
                if config is None:
                    continue
                seen.add(deployment.pk)
                load = self.ongoing(deployment, client, inflight)
                if load is None:
                    continue  # nothing says what it runs: leave it as it is
                running = deployment.replica_count
                target = self.decider.decide(deployment.pk, config, running, load, self.clock())
                if target is not None:
                    done += self.step(deployment, running, target, load, config)
        for gone in set(self.decider.wishes) - seen:
            self.decider.forget(gone)  # stopped or no longer autoscaled: its delays restart
        return done

    @staticmethod
    def ongoing(
        deployment: Deployment, client: httpx.Client, inflight: dict[str, float]
    ) -> float | None:
        loader = get_loader(deployment.loader)
        if loader.serves_metrics:
            urls = list(deployment.engine_urls)
            load = replicas_load(client, urls, loader, engine_secrets.auth(deployment))
            if load is not None:
                return load.running + load.waiting
        return inflight.get(deployment.name, 0.0)

    def step(
        self,
        deployment: Deployment,
        running: int,
        target: int,
        load: float,
        config: AutoscalingConfig,
    ) -> list[str]:
        why = (
            f"{load:g} ongoing requests for {running} replicas"
            f" (target {config.target_ongoing_requests:g} each)"
        )
        done = []
        try:
            for _ in range(target - running):
                if not scaling.add_replica(deployment.pk, why):
                    break
                done.append(f"{deployment.name}: one replica more")
            if target < running and scaling.remove_replica(deployment.pk, why):
                done.append(f"{deployment.name}: one replica less")
        except InsufficientMemory:
            pass  # the event says so; the next look tries again
        except EngineUnreachable as exc:
            log.warning("%s: not scaled: %s", deployment.name, exc)
        return done

    def run(self, stop: threading.Event) -> None:
        """Look every MSHIP_AUTOSCALE_INTERVAL_S until `stop` is set (serve's thread)."""
        while not stop.wait(settings.MSHIP_AUTOSCALE_INTERVAL_S):
            close_old_connections()
            try:
                self.tick()
            except Exception:
                log.exception("the autoscaler's look failed")
