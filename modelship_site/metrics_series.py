"""Every deployment's series at 0 in /metrics before anything happens to it.

prometheus_client exports a labelled series only once something records into it: without
this, a fresh site's queue, cold-start and request series are absent until their first
event, and a dashboard's panels say "No data" where the truth is 0 (and rate() over a
counter's first increment sees no rise). Creating a label set (labels()) writes it at 0 in
this process's file, which /metrics sums with the others; done at each scrape, so a
deployment made since (in any process) has its series by the next one.
"""

from __future__ import annotations

from common import metrics
from deployments.loaders import EngineSpec, get_loader
from deployments.models import Deployment
from ondemand.policy import StartOutcome
from openai_api.access import prepare_series

# The endings the controller counts: "elsewhere" is counted by the process that starts it,
# and "nobody" started nothing.
COUNTED_OUTCOMES = tuple(
    outcome
    for outcome in StartOutcome
    if outcome not in (StartOutcome.ELSEWHERE, StartOutcome.NOBODY)
)


def prepare_known_series() -> None:
    for deployment in Deployment.objects.only(
        "name", "loader", "model", "usecase", "aliases", "config", "num_gpus", "memory_gib"
    ):
        name = deployment.name
        metrics.inflight_of(name)
        metrics.queued.labels(name)
        metrics.queue_timeouts.labels(name)
        metrics.make_room_stops.labels(name)
        metrics.drains.labels(name)
        metrics.out_of_memory_retries.labels(name)
        for reason in ("request", "preload", "baseline", "retry"):
            metrics.starts.labels(name, reason)
        for reason in ("idle", "make_room", "slept_long"):
            metrics.evictions.labels(name, reason)
        metrics.start_failures.labels(name)
        metrics.cold_start_duration.labels(name)
        for outcome in COUNTED_OUTCOMES:
            metrics.cold_starts.labels(name, outcome.value)
        endpoint = main_endpoint(deployment)
        if endpoint:
            prepare_series(name, endpoint)


def main_endpoint(deployment: Deployment) -> str | None:
    """The first endpoint the deployment's engine serves (chat/completions for a chat
    model, embeddings for an embedder): one label set draws the model's line; the others
    come with their first request."""
    try:
        served = get_loader(deployment.loader).endpoints(EngineSpec.of(deployment))
    except (KeyError, NotImplementedError):  # a plugin's loader that is not installed here
        return None
    return served[0] if served else None
