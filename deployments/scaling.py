"""One replica more or less for a running deployment (the autoscaler's steps).

A replica is added under the start-up gate, past the fit check for one more replica
(Ray's placement on the ray runtime), and joins the routes once healthy. A replica is
removed only when idle: it leaves the routes first, then is drained (the drain grace, and
its engine's gauges showing nothing running or waiting) before it stops, so no request is
cut. Each step is an event and an audit row.

Blocking (launches, health waits, drains): the autoscaler's thread calls it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from deployments import audit
from deployments.audit import event
from deployments.drain import drain
from deployments.gate import start_gate
from deployments.health_wait import StartFailed, handles_of, wait_healthy
from deployments.launch import launch_all, stop_handles
from deployments.memory import InsufficientMemory, check_fit_more
from deployments.models import Deployment, State
from deployments.runtimes import RuntimeError_

ACTOR = "autoscaler"


def add_replica(deployment_id: int, reason: str, actor: str = ACTOR) -> bool:
    """Start one more replica of a ready deployment; False when it is not ready or the new
    replica failed (an event says why). InsufficientMemory when it does not fit now."""
    with start_gate():
        deployment = Deployment.objects.get(pk=deployment_id)
        if deployment.state != State.READY:
            return False
        count = deployment.replica_count
        try:
            placed = check_fit_more(deployment)
        except InsufficientMemory as exc:
            event(deployment, "scale_up_refused", str(exc), actor=actor)
            raise
        taken = {int(h.get("replica", 0)) for h in handles_of(deployment)}
        number = next(i for i in range(len(taken) + 1) if i not in taken)
        new = []
        try:
            new = launch_all(deployment, placed, indices=[number])
            wait_healthy(deployment, new, settings.MSHIP_START_TIMEOUT_S)
        except (RuntimeError_, StartFailed) as exc:
            stop_handles(deployment, new)
            event(deployment, "scale_up_failed", f"{count} replicas still serve: {exc}", actor)
            return False
        with transaction.atomic():
            row = Deployment.objects.select_for_update().get(pk=deployment_id)
            if row.state != State.READY:
                stop_handles(row, new)  # stopped meanwhile: the new replica is ours to undo
                return False
            row.runtime_handle = {"replicas": [*handles_of(row), *new]}
            row.engine_urls = [*row.engine_urls, *(h["url"] for h in new)]
            row.gpus = [*(row.gpus or []), *placed] if placed and any(placed) else row.gpus
            row.replicas = count + 1
            row.save(update_fields=["runtime_handle", "engine_urls", "gpus", "replicas"])
        text = f"{count} → {count + 1} replicas: {reason}"
        event(row, "scaled_up", text, actor=actor)
        audit.record("scale", row, actor=actor, text=text)
    return True


def remove_replica(deployment_id: int, reason: str, actor: str = ACTOR) -> bool:
    """Take the newest replica out of the routes, let it finish what it serves, stop it;
    False when the deployment is not ready or runs one replica only."""
    with transaction.atomic():
        row = Deployment.objects.select_for_update().get(pk=deployment_id)
        handles = handles_of(row)
        if row.state != State.READY or len(handles) <= 1:
            return False
        count = row.replica_count
        leaving = max(handles, key=lambda h: int(h.get("replica", 0)))
        position = handles.index(leaving)
        row.runtime_handle = {"replicas": [h for h in handles if h is not leaving]}
        row.engine_urls = [url for url in row.engine_urls if url != leaving["url"]]
        if row.gpus and position < len(row.gpus):
            row.gpus = [g for i, g in enumerate(row.gpus) if i != position]
        row.replicas = count - 1
        row.save(update_fields=["runtime_handle", "engine_urls", "gpus", "replicas"])
    # Routers still holding the old route send it a request for a moment: the drain grace.
    drain(row, [leaving])
    stop_handles(row, [leaving])
    text = f"{count} → {count - 1} replicas: {reason}"
    event(row, "scaled_down", text, actor=actor)
    audit.record("scale", row, actor=actor, text=text)
    return True
