"""After a Modelship restart: adopt the engines that still run, settle the ones that do not."""

from __future__ import annotations

import logging

from deployments.deployer import handles_of, stop, stop_handles
from deployments.gate import start_gate
from deployments.models import Deployment, State
from deployments.runtimes import get_runtime
from deployments.transitions import transition

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "Modelship shut down"


def adopt_all() -> dict[str, list[str]]:
    """Settle every deployment against what really runs; returns names by outcome.

    It holds the start-up gate, so no start is half-way while it looks: a row still marked
    starting belongs to a start that died with its process.
    """
    outcome: dict[str, list[str]] = {"adopted": [], "stopped": []}
    with start_gate():
        for deployment in Deployment.objects.all():
            handles = handles_of(deployment)
            runtime = get_runtime(deployment.runtime)
            alive = [h for h in handles if runtime.is_alive(h)]
            if (
                deployment.state in (State.READY, State.ASLEEP)
                and handles
                and len(alive) == len(handles)
            ):
                outcome["adopted"].append(deployment.name)
                log.info("adopted %s (%d engine(s))", deployment.name, len(handles))
                continue
            if deployment.state in (State.PLANNED, State.STOPPED, State.FAILED):
                if alive:
                    stop_handles(deployment, alive)
                if handles:
                    Deployment.objects.filter(pk=deployment.pk).update(
                        runtime_handle={}, engine_urls=[]
                    )
                continue
            stop_handles(deployment, alive)
            reasons: dict[str, str] = {
                State.STARTING: "start interrupted by a Modelship restart",
                State.STOPPING: "stop completed after a Modelship restart",
            }
            reason = reasons.get(deployment.state, "engine gone when Modelship restarted")
            transition(
                deployment,
                State.STOPPED,
                expected=[deployment.state],
                reason=reason,
                engine_urls=[],
                runtime_handle={},
                running_fingerprint="",
            )
            outcome["stopped"].append(deployment.name)
    return outcome


def stop_all(reason: str = SHUTDOWN_REASON) -> list[str]:
    """Stop every running engine (Modelship's own shutdown); returns the names stopped."""
    stopped = []
    for deployment in Deployment.objects.exclude(
        state__in=(State.PLANNED, State.STOPPED, State.FAILED)
    ):
        if stop(deployment.pk, reason=reason):
            stopped.append(deployment.name)
    return stopped
