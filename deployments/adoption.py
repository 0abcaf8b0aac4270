"""After a Modelship restart: adopt the engines that still run, settle the ones that do not,
remove containers no deployment owns, and replace engines whose configuration changed."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone

from deployments import tasks
from deployments.deployer import handles_of, stop
from deployments.fingerprint import deployment_fingerprint
from deployments.gate import no_start_under_way
from deployments.launch import stop_handles
from deployments.models import Deployment, Mode, State
from deployments.runtimes import EngineUnreachable, engine_key, get_runtime, names
from deployments.task_queue import enqueue
from deployments.transitions import transition

if TYPE_CHECKING:
    from deployments.runtimes.base import Handle

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "Modelship shut down"


def adopt_all() -> dict[str, list[str]]:
    """Settle every deployment against what really runs; returns names by outcome.

    It holds the start-up gate and waits for the starts under way (gate.no_start_under_way),
    so no start is half-way while it looks: a row still marked starting belongs to a start
    that died with its process. A deployment whose runtime does
    not answer (the Docker Engine is down) is left exactly as it was.
    """
    outcome: dict[str, list[str]] = {
        "adopted": [],
        "stopped": [],
        "replaced": [],
        "orphans_removed": [],
        "unreachable": [],
    }
    with no_start_under_way():
        # A start that was preparing when its process died prepares no more.
        Deployment.objects.exclude(start_phase="").update(start_phase="")
        for deployment in Deployment.objects.all():
            try:
                settle(deployment, outcome)
            except EngineUnreachable as exc:
                log.warning("%s: left as it was: %s", deployment.name, exc)
                outcome["unreachable"].append(deployment.name)
        remove_orphans(outcome)
    return outcome


def settle(deployment: Deployment, outcome: dict[str, list[str]]) -> None:
    handles = handles_of(deployment)
    runtime = get_runtime(deployment.runtime)
    alive = [h for h in handles if runtime.is_alive(h)]
    if deployment.state in (State.READY, State.ASLEEP) and handles and len(alive) == len(handles):
        outcome["adopted"].append(deployment.name)
        # The GPUs each replica was given, as the engines themselves say (their environment
        # or labels): the budget counts them there, whatever the row said.
        read = [runtime.gpus_of(h) for h in handles]
        placed = [p for p in read if p is not None]
        if len(placed) == len(read):
            placed = placed if any(placed) else []  # on no GPU, as a start records it
            if placed != deployment.gpus:
                Deployment.objects.filter(pk=deployment.pk).update(gpus=placed)
        # The on-demand idle timer restarts when Modelship first sees an engine after a
        # restart: a lease lapsed while it was down must not let the reaper stop it at once.
        idle = timedelta(seconds=deployment.effective_idle_timeout_s)
        Deployment.objects.filter(pk=deployment.pk).update(lease_until=timezone.now() + idle)
        if deployment.running_fingerprint != deployment_fingerprint(deployment):
            # A replacement the previous run had not finished, or a change made meanwhile.
            enqueue(tasks.replace, deployment.pk, settings.MSHIP_REPLACE_STRATEGY, "system")
            outcome["replaced"].append(deployment.name)
        return
    if deployment.state in (State.PLANNED, State.STOPPED, State.FAILED):
        stop_handles(deployment, alive)
        if handles:
            Deployment.objects.filter(pk=deployment.pk).update(runtime_handle={}, engine_urls=[])
        return
    stop_handles(deployment, alive)
    reasons: dict[str, str] = {
        State.STARTING: "start interrupted by a Modelship restart",
        State.STOPPING: "stop completed after a Modelship restart",
    }
    transition(
        deployment,
        State.STOPPED,
        expected=[deployment.state],
        reason=reasons.get(deployment.state, "engine gone when Modelship restarted"),
        engine_urls=[],
        runtime_handle={},
        running_fingerprint="",
    )
    outcome["stopped"].append(deployment.name)


def remove_orphans(outcome: dict[str, list[str]]) -> None:
    """Remove this site's engines that no deployment's handle names (runtimes that can list
    their engines: docker's containers, Ray's jobs)."""
    owned = {engine_key(h) for d in Deployment.objects.all() for h in handles_of(d)}
    for name in names():
        runtime = get_runtime(name)
        try:
            found: list[Handle] | None = runtime.managed()
        except EngineUnreachable as exc:
            log.warning("cannot look for orphan %s engines: %s", name, exc)
            continue
        for handle in found or []:
            if engine_key(handle) not in owned:
                runtime.remove(handle)
                outcome["orphans_removed"].append(
                    str(handle.get("container_name") or engine_key(handle))
                )


def to_start_at_serve() -> list[Deployment]:
    """What `serve` starts as it starts: the always-on deployments its last shutdown stopped
    (one an operator stopped stays stopped), and the on-demand ones marked preload that run
    nothing (a failed one waits for its next request or an operator)."""
    found = []
    for deployment in Deployment.objects.filter(state__in=(State.PLANNED, State.STOPPED)):
        if deployment.effective_mode == Mode.ALWAYS_ON:
            if deployment.state_reason == SHUTDOWN_REASON:
                found.append(deployment)
        elif deployment.preload and deployment.effective_mode == Mode.ON_DEMAND:
            found.append(deployment)
    return found


def stop_all(reason: str = SHUTDOWN_REASON) -> list[str]:
    """Stop every running engine (Modelship's own shutdown); returns the names stopped."""
    stopped = []
    for deployment in Deployment.objects.exclude(
        state__in=(State.PLANNED, State.STOPPED, State.FAILED)
    ):
        try:
            if stop(deployment.pk, reason=reason):
                stopped.append(deployment.name)
        except EngineUnreachable as exc:
            log.warning("%s: not stopped: %s", deployment.name, exc)
    return stopped
