"""What an operator asks of a deployment, from the admin or the API.

Each request is checked and audited here, at once, then the engine work is queued for the
django-q cluster after the transaction commits; the caller answers without waiting for it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from deployments import audit, hooks, task_queue
from deployments.deployer import CannotSleep
from deployments.loaders import EngineSpec, get_loader
from deployments.memory import check_fit
from deployments.models import STARTABLE_STATES, Deployment, Mode, State


class InvalidState(Exception):
    pass


QUEUED = "queued"


def request_start(deployment: Deployment, user: Any) -> str:
    """Queue a start; raises InsufficientMemory when it cannot fit now."""
    if deployment.state not in STARTABLE_STATES:
        return deployment.state
    check_fit(deployment)
    with transaction.atomic():
        audit.record("start", deployment, user=user)
        task_queue.enqueue("start", deployment.pk, audit.actor_of(user, None))
    return QUEUED


def request_stop(deployment: Deployment, user: Any) -> str:
    if deployment.state in (State.PLANNED, State.STOPPED, State.STOPPING):
        return deployment.state
    actor = audit.actor_of(user, None)
    with transaction.atomic():
        audit.record("stop", deployment, user=user)
        task_queue.enqueue("stop", deployment.pk, actor, f"stopped by {actor}")
    return QUEUED


def request_sleep(deployment: Deployment, user: Any) -> str:
    if not get_loader(deployment.loader).can_sleep(EngineSpec.of(deployment)):
        raise CannotSleep(f"the {deployment.loader} engine of {deployment.name} cannot sleep")
    if deployment.state != State.READY:
        raise InvalidState(f"{deployment.name} is {deployment.state}; only a ready one can sleep")
    with transaction.atomic():
        audit.record("sleep", deployment, user=user)
        task_queue.enqueue("sleep", deployment.pk, audit.actor_of(user, None))
    return QUEUED


def request_wake(deployment: Deployment, user: Any) -> str:
    if deployment.state != State.ASLEEP:
        raise InvalidState(f"{deployment.name} is {deployment.state}; only an asleep one wakes")
    check_fit(deployment)
    with transaction.atomic():
        audit.record("wake", deployment, user=user)
        task_queue.enqueue("wake", deployment.pk, audit.actor_of(user, None))
    return QUEUED


def set_mode(deployment: Deployment, mode: str, user: Any) -> Deployment:
    """Switch between on demand and always on, audited as ondemand_mode.

    A switch to always on of a deployment that does not run starts it first and keeps it
    on demand with pending_mode set until the start ends, so its name never stops being
    served; a start that cannot fit is refused and changes nothing.
    """
    if deployment.system and mode == Mode.ON_DEMAND:
        raise InvalidState(f"{deployment.name} is a system deployment and is always on")
    old = deployment.effective_mode
    needs_start = mode == Mode.ALWAYS_ON and deployment.state in (*STARTABLE_STATES, State.ASLEEP)
    if needs_start:
        check_fit(deployment)
    with transaction.atomic():
        if needs_start and old == Mode.ON_DEMAND:
            Deployment.objects.filter(pk=deployment.pk).update(pending_mode=mode)
        else:
            changes: dict[str, Any] = {"mode": mode, "pending_mode": None}
            if mode == Mode.ON_DEMAND:
                # The idle timer restarts when a deployment is switched to on demand.
                idle = deployment.idle_timeout_s or settings.MSHIP_ONDEMAND_IDLE_TIMEOUT_S
                changes["lease_until"] = timezone.now() + timedelta(seconds=idle)
            Deployment.objects.filter(pk=deployment.pk).update(**changes)
        deployment.refresh_from_db()
        forgive_start_failures(deployment.pk)
        audit.record(
            "ondemand_mode",
            deployment,
            user=user,
            before={"mode": old},
            after={"mode": mode, "pending_mode": deployment.pending_mode},
        )
        hooks.listing_has_changed()  # the mode changes where LiteLLM sends the name
        if needs_start:
            task = "wake" if deployment.state == State.ASLEEP else "start"
            task_queue.enqueue(task, deployment.pk, audit.actor_of(user, None))
    return deployment


def forgive_start_failures(deployment_id: int) -> None:
    """A mode switch or a changed configuration resets the on-demand start backoff of the
    controller in this process (the gateway's, when Modelship runs as one server)."""
    hooks.forgive_start_failures(deployment_id)


def request_remove(deployment: Deployment, user: Any) -> str:
    """Delete at once when nothing runs; else stop the engine first (queued)."""
    actor = audit.actor_of(user, None)
    with transaction.atomic():
        if deployment.state in (State.PLANNED, State.STOPPED, State.FAILED):
            audit.record("delete", deployment, user=user, before=deployment.snapshot())
            deployment.delete()
            hooks.listing_has_changed()  # its entries leave LiteLLM
            return "deleted"
        task_queue.enqueue("remove", deployment.pk, actor)
    return QUEUED
