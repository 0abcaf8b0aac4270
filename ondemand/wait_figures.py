"""A waiting request's figures, as the controller knows them (openai_api/wait_status.py says
how they are told): what it waits for, its model's place in the memory queue, what the start
does now, and the seconds left by the model's measured start (Deployment.start_s; a minute
before any was measured) plus those of the starts ranked ahead of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ondemand import preparing
from ondemand.policy import START_S_UNMEASURED

if TYPE_CHECKING:
    from ondemand.controller import Controller


def of(ctl: Controller, deployment_id: int) -> dict[str, Any] | None:
    entry = ctl.entries.get(deployment_id)
    if entry is None:
        return None
    now = ctl.clock.now()
    own = entry.start_s if entry.start_s is not None else START_S_UNMEASURED
    if deployment_id in ctl.queue:
        order = queue_order(ctl)
        if deployment_id in order:
            place = order.index(deployment_id) + 1
            ahead = sum(_start_of(ctl, other) for other in order[: place - 1])
            return {"waiting_for": "memory", "position": place, "eta_s": round(ahead + own)}
    if entry.attempt is not None and not entry.attempt.done():
        if entry.waking:
            return {"waiting_for": "its wake", "position": 0, "eta_s": None}
        left = max(1.0, own - (now - entry.attempt_began))
        figures = {"waiting_for": "its start", "position": 0, "eta_s": round(left)}
        if doing := preparing.doing(deployment_id):
            figures["doing"] = doing
        return figures
    return None


def queue_order(ctl: Controller) -> list[int]:
    """The memory queue in the order it is served (the head first), as it stood this second:
    every waiting stream asks for its place each second."""
    now = ctl.clock.now()
    if ctl.order[0] != int(now):
        ranks = {d: ctl.entry(d).rank(now, ctl.aging_s) for d in ctl.queue}
        waiting = [d for d in ctl.queue if ranks[d] is not None]
        ctl.order = (int(now), sorted(waiting, key=lambda d: -(ranks[d] or 0.0)))
    return ctl.order[1]


def shown(figures: dict[str, Any] | None) -> dict[str, Any]:
    """The part of the figures a deployment's status carries: its place in the memory queue
    and the seconds its start is estimated to take still (None: nothing waits, or unknown)."""
    figures = figures or {}
    return {"position": figures.get("position") or None, "eta_s": figures.get("eta_s")}


def _start_of(ctl: Controller, deployment_id: int) -> float:
    measured = ctl.entry(deployment_id).start_s
    return measured if measured is not None else START_S_UNMEASURED
