"""An engine's Prometheus endpoint: its load gauges (make-room's idle check), and its
whole text for operators (/api/deployments/{id}/metrics, Prometheus service discovery)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
from django.urls import reverse

from deployments import engine_secrets
from deployments.loaders import get_loader
from deployments.models import Deployment, State
from deployments.refusals import EngineDidNotAnswer, InvalidState, NotServed

if TYPE_CHECKING:
    from deployments.loaders import Loader

# name{labels} value — labels optional; names vary across engine versions, so each gauge is
# looked up by the exact name its loader gives, summing every labelled series of it.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)")


@dataclass(frozen=True)
class Load:
    running: float
    waiting: float

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


def parse_gauges(text: str, names: set[str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in names:
            try:
                value = float(match.group(3))
            except ValueError:
                continue
            found[match.group(1)] = found.get(match.group(1), 0.0) + value
    return found


def replicas_load(
    client: httpx.Client, urls: list[str], loader: Loader, auth: httpx.Auth | None = None
) -> Load | None:
    """The load of every replica together; None when one of them cannot be read. `auth`:
    the engines' secrets (engine_secrets.auth), else the client's own."""
    loads = [read_load(client, url, loader, auth) for url in urls]
    if not loads or any(load is None for load in loads):
        return None
    return Load(
        running=sum(load.running for load in loads if load),
        waiting=sum(load.waiting for load in loads if load),
    )


def read_load(
    client: httpx.Client, url: str, loader: Loader, auth: httpx.Auth | None = None
) -> Load | None:
    """The engine's running and waiting requests; None when it has no gauges or no answer."""
    if not loader.running_gauge:
        return None
    names = {loader.running_gauge, loader.waiting_gauge or ""}
    try:
        # llama.cpp's /metrics asks for the engine's key.
        answer = client.get(url + "/metrics", auth=auth or httpx.USE_CLIENT_DEFAULT)
        answer.raise_for_status()
    except httpx.HTTPError:
        return None
    gauges = parse_gauges(answer.text, names)
    if loader.running_gauge not in gauges:
        return None
    return Load(
        running=gauges[loader.running_gauge],
        waiting=gauges.get(loader.waiting_gauge or "", 0.0),
    )


ENGINE_METRICS_TIMEOUT_S = 5.0


def engine_metrics_text(deployment: Deployment, replica: int) -> str:
    """A running replica's own Prometheus metrics, as its engine serves them."""
    loader = get_loader(deployment.loader)
    if not loader.serves_metrics:
        raise NotServed(f"{deployment.name}'s engine ({deployment.loader}) serves no metrics.")
    urls = list(deployment.engine_urls or [])
    if deployment.state not in (State.READY, State.ASLEEP) or not urls:
        raise InvalidState(
            f"{deployment.name} is {deployment.state}: no engine runs.", deployment.state
        )
    if replica >= len(urls):
        raise NotServed(f"{deployment.name} has {len(urls)} replica(s); there is no {replica}.")
    try:
        answer = httpx.get(
            urls[replica] + "/metrics",
            timeout=ENGINE_METRICS_TIMEOUT_S,
            auth=engine_secrets.auth(deployment),
        )
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        raise EngineDidNotAnswer(
            f"{deployment.name}'s engine (replica {replica}) did not answer /metrics: {exc}"
        ) from exc
    return answer.text


def scrape_targets() -> list[dict[str, object]]:
    """Prometheus HTTP service discovery: one target per running replica that has metrics.

    The target is the engine's own address, for a Prometheus that reaches it (on this host,
    on the engines' network); `__meta_modelship_metrics_path` is where Modelship serves the
    same text, for one that reaches Modelship only (a container, another host): its
    relabelling takes that path, `replica` as a parameter, and Modelship's address."""
    targets: list[dict[str, object]] = []
    running = Deployment.objects.filter(state__in=(State.READY, State.ASLEEP)).order_by("name")
    for deployment in running:
        if not get_loader(deployment.loader).serves_metrics:
            continue
        for replica, url in enumerate(deployment.engine_urls or []):
            address = urlsplit(url).netloc
            labels = {
                "deployment": deployment.name,
                "replica": str(replica),
                "loader": deployment.loader,
                "__meta_modelship_metrics_path": reverse(
                    "deployment-metrics", args=[deployment.pk]
                ),
            }
            targets.append({"targets": [address], "labels": labels})
    return targets
