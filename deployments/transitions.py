"""State changes as conditional updates, each with its event.

Every change is ``UPDATE ... WHERE state IN (expected)``: whoever changes a row first wins and
the others see zero rows, whichever process they run in. That is what lets a stop, a start and
an adoption race without a lock around the whole operation.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common import metrics
from deployments import hooks
from deployments.audit import event
from deployments.models import Deployment, Mode, State

if TYPE_CHECKING:
    from collections.abc import Iterable

# Entering or leaving these states changes what LiteLLM should list.
LITELLM_STATES = {State.READY, State.FAILED, State.PLANNED}


def transition(
    deployment: Deployment,
    to: str,
    *,
    expected: Iterable[str],
    reason: str = "",
    actor: str = "system",
    drop_switch: bool = False,
    **fields: Any,
) -> bool:
    """Move the deployment to ``to`` if it is still in one of ``expected``; refresh it.

    A mode switch waiting for this start (pending_mode) is applied when the start ends ready,
    failed or stopped; with ``drop_switch`` (the container engine refused: nothing of the
    engine ran) it is dropped instead, whatever ``to`` is, and the reason says so."""
    expected = list(expected)
    with transaction.atomic():
        updates: dict[str, Any] = {
            "state": to,
            "state_reason": reason,
            "state_changed_at": timezone.now(),
            "updated": timezone.now(),
            # A state change ends the preparing of a start (whose process may have died
            # without saying so): its step is not shown past it.
            "start_phase": "",
            **fields,
        }
        if to in (State.PLANNED, State.STOPPED, State.FAILED):
            updates.setdefault("gpus", [])  # no engine: its GPUs are free for others
        if to not in (State.ASLEEP, State.STOPPING):
            updates.setdefault("sleep_level", None)  # awake or gone: no tier
            updates.setdefault("asleep_gib", None)
        if to == State.READY:
            # The on-demand idle timer restarts when a deployment becomes ready.
            idle = (
                Deployment.objects.filter(pk=deployment.pk)
                .values_list("idle_timeout_s", flat=True)
                .first()
            ) or settings.MSHIP_ONDEMAND_IDLE_TIMEOUT_S
            updates.setdefault("lease_until", timezone.now() + timedelta(seconds=idle))
            if State.STARTING in expected:
                updates.update(measured_start(deployment.pk))
        if drop_switch or to in (State.READY, State.FAILED, State.STOPPED):
            # A mode switch that waited for this start is applied with the state it waited for.
            pending = (
                Deployment.objects.filter(pk=deployment.pk).values_list("pending_mode", flat=True)
            ).first()
            if pending and drop_switch:
                updates["pending_mode"] = None
                mode = pending.replace("_", " ")
                updates["state_reason"] = f"{reason} (the switch to {mode} was not made)"
            elif pending:
                updates["mode"] = pending
                updates["pending_mode"] = None
        changed = Deployment.objects.filter(pk=deployment.pk, state__in=expected).update(**updates)
        if changed:
            deployment.refresh_from_db()
            event(deployment, to, reason, actor=actor)
            if to == State.FAILED and State.STARTING in expected:
                metrics.start_failures.labels(deployment.name).inc()
            if {to, *expected} & LITELLM_STATES:
                hooks.listing_has_changed()
            hooks.state_has_changed(deployment.pk)
    if not changed:
        with contextlib.suppress(Deployment.DoesNotExist):
            deployment.refresh_from_db()
    return bool(changed)


def refused_to(deployment_id: int, prior: str) -> str:
    """Where a start the runtime refused (nothing of the engine ran: the container engine's
    refusal, no image, no environment) leaves the deployment: failed; but a mode switch's
    start leaves it as it was, its switch dropped (the on-demand seed)."""
    pending = (
        Deployment.objects.filter(pk=deployment_id).values_list("pending_mode", flat=True)
    ).first()
    return prior if pending else State.FAILED


def measured_start(deployment_id: int) -> dict[str, float]:
    """The running mean of its starts, with this one (STARTING until now) weighing half: what
    the scheduler reads as the cost of bringing it back. Nothing when it was not starting."""
    row = (
        Deployment.objects.filter(pk=deployment_id, state=State.STARTING)
        .values_list("state_changed_at", "start_s")
        .first()
    )
    if row is None or row[0] is None:
        return {}
    took = max(0.0, (timezone.now() - row[0]).total_seconds())
    return {"start_s": round(took if row[1] is None else (row[1] + took) / 2, 3)}


__all__ = ["Mode", "State", "refused_to", "transition"]
