"""The deployer: start, stop, sleep, wake and replace engines within the memory budget.

Its functions block (they launch processes and wait for health) and run in django-q workers,
management commands and test threads, never in the event loop. Every start passes the fit
check and claims its memory (the row marked starting with its GPUs) under the start-up gate,
and waits for its engine's health outside it; every state change is a conditional update
with its event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common import metrics
from deployments import engine_envs, engine_secrets, kv_store, out_of_memory, sleep_tiers
from deployments.audit import event, event_at
from deployments.drain import drain
from deployments.fingerprint import deployment_fingerprint
from deployments.footprint import after_start, measured_gib
from deployments.gate import bringing_up, start_gate
from deployments.health_wait import StartFailed, handles_of, wait_healthy
from deployments.launch import launch_all, needs_of, prepare, prepare_start, stop_handles
from deployments.loaders import EngineSpec, get_loader
from deployments.memory import InsufficientMemory, check_fit, check_fit_where
from deployments.models import STARTABLE_STATES, Deployment, State
from deployments.refusals import CannotSleep
from deployments.runtimes import EngineUnreachable, Handle, RuntimeError_
from deployments.transitions import refused_to, transition

log = logging.getLogger(__name__)

Precheck = Callable[[Deployment], bool]

__all__ = [
    "InsufficientMemory",
    "StartFailed",
    "handles_of",
    "prepare",
    "replace",
    "rest",
    "restart",
    "sleep",
    "stop",
    "wake",
]


# Prepares of one start, where its configuration changes while it prepares (then, the gate).
PREPARE_TRIES = 3


def _bring_up(deployment: Deployment, prior: str, actor: str, timeout_s: float) -> Deployment:
    """Launch a deployment that is already marked starting and wait for its health."""
    try:
        handles = launch_all(deployment)
    except EngineUnreachable as exc:
        # Nothing is known to have started: the deployment goes back to how it was, and a
        # mode switch waiting for this start is dropped (its requests stop waiting for it).
        transition(
            deployment,
            prior,
            expected=[State.STARTING],
            reason=str(exc),
            actor=actor,
            drop_switch=True,
        )
        raise
    except RuntimeError_ as exc:
        # The container engine refused the launch: failed, or as it was where a mode switch
        # started it (the seed); the switch is dropped, not applied.
        transition(
            deployment,
            refused_to(deployment.pk, prior),
            expected=[State.STARTING],
            reason=str(exc),
            actor=actor,
            drop_switch=True,
        )
        return deployment
    urls = [h["url"] for h in handles]
    saved = Deployment.objects.filter(pk=deployment.pk, state=State.STARTING).update(
        runtime_handle={"replicas": handles}, engine_urls=urls
    )
    if not saved:
        # Stopped or removed while launching: the launch is ours to undo.
        stop_handles(deployment, handles)
        return deployment
    try:
        wait_healthy(deployment, handles, timeout_s)
    except EngineUnreachable as exc:
        # What runs is unknown; the next adoption removes the container as an orphan.
        transition(
            deployment,
            prior,
            expected=[State.STARTING],
            reason=str(exc),
            actor=actor,
            engine_urls=[],
            runtime_handle={},
        )
        raise
    except StartFailed as exc:
        stop_handles(deployment, handles)
        reason, learned = str(exc), dict[str, Any]()
        if (said := out_of_memory.cause(reason)) is not None:
            reason, learned = out_of_memory.explained(deployment, said, reason)
        transition(
            deployment,
            State.FAILED,
            expected=[State.STARTING],
            reason=reason,
            actor=actor,
            engine_urls=[],
            runtime_handle={},
            **learned,
        )
        return deployment
    transition(
        deployment,
        State.READY,
        expected=[State.STARTING],
        actor=actor,
        running_fingerprint=deployment_fingerprint(deployment),
        **after_start(deployment, handles),
    )
    return deployment


def restart(
    deployment_id: int,
    *,
    actor: str = "system",
    timeout_s: float | None = None,
    on_start: Callable[[], None] | None = None,
) -> Deployment:
    """Start a planned, stopped or failed deployment; anything else is left as it is.
    `on_start` is called once this call has marked it starting (it started it).

    Raises InsufficientMemory (leaving the deployment as it was) when it does not fit.
    """
    timeout = timeout_s if timeout_s is not None else settings.MSHIP_START_TIMEOUT_S
    deployment = Deployment.objects.get(pk=deployment_id)
    if deployment.state not in STARTABLE_STATES or deployment.adapter_of_id is not None:
        return deployment  # an adapter runs in its base's engine
    fit_or_refuse(deployment, actor)  # nothing is pulled or installed for a start that cannot fit
    up = ExitStack()
    for attempt in range(PREPARE_TRIES):
        prepared = prepare(deployment_id, actor=actor)
        if prepared is None:
            return Deployment.objects.get(pk=deployment_id)
        with start_gate():
            deployment = Deployment.objects.get(pk=deployment_id)
            if deployment.state not in STARTABLE_STATES:
                return deployment
            if needs_of(deployment) != prepared:
                if attempt + 1 < PREPARE_TRIES:
                    continue  # its configuration changed as it prepared: prepare the new one
                # Changing on and on: prepared here, under the gate, once.
                if prepare(deployment_id, actor=actor) is None:
                    return Deployment.objects.get(pk=deployment_id)
                deployment.refresh_from_db()
            placed = fit_or_refuse(deployment, actor)
            prior = deployment.state
            # An autoscaled deployment starts again from its initial count (replicas=0).
            # Marked starting with its GPUs, it holds its memory for every later fit check:
            # the claim is made, and the gate is let go before the engine's health wait, so
            # that other starts and wakes need not wait behind this one's minutes.
            started = transition(
                deployment, State.STARTING, expected=[prior], actor=actor, gpus=placed, replicas=0
            )
            if not started:
                return deployment
            up.enter_context(bringing_up())  # before the gate goes: adoption waits for it
        with up:
            if on_start is not None:
                on_start()
            return _bring_up(deployment, prior, actor, timeout)
    raise AssertionError("unreachable: the last try starts or returns")


def fit_or_refuse(deployment: Deployment, actor: str, *, waking: bool = False) -> list[list[int]]:
    """The fit check of a start (placing it: each replica's GPUs) or of a wake (where it
    ran). A refused one leaves the deployment as it was, but for a waiting mode switch,
    which it clears; the refusal is an event."""
    try:
        if waking:
            check_fit_where(deployment, deployment.gpus or [])
            return list(deployment.gpus or [])
        return check_fit(deployment)
    except InsufficientMemory as exc:
        Deployment.objects.filter(pk=deployment.pk).update(pending_mode=None)
        event(deployment, "start_refused", str(exc), actor=actor)
        raise


def stop(
    deployment_id: int,
    *,
    precheck: Precheck | None = None,
    actor: str = "system",
    reason: str = "",
) -> bool:
    """Stop a deployment's engines. False when there was nothing to stop or the precheck
    refused; the precheck sees the locked, freshly read row and runs with no await."""
    marked = _mark_stopping(deployment_id, precheck, actor, reason)
    if marked is None:
        return False
    return _take_down(*marked, actor=actor, reason=reason)


def _mark_stopping(
    deployment_id: int,
    precheck: Precheck | None,
    actor: str,
    reason: str,
    only_from: tuple[str, ...] | None = None,
) -> tuple[Deployment, str] | None:
    """Mark the row stopping under its lock once the precheck approves (with its prior
    state), or None: from then on no lease is granted and acquire sees it as not ready, so
    a slot handed out and a stop approved never interleave."""
    with transaction.atomic():
        try:
            deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
        except Deployment.DoesNotExist:
            return None
        if deployment.state in (State.PLANNED, State.STOPPED, State.STOPPING):
            return None
        if only_from is not None and deployment.state not in only_from:
            return None
        if precheck is not None and not precheck(deployment):
            return None
        prior = deployment.state
        if not transition(deployment, State.STOPPING, expected=[prior], reason=reason, actor=actor):
            return None
    return deployment, prior


def _take_down(deployment: Deployment, prior: str, *, actor: str, reason: str) -> bool:
    """Stop the engines of a row marked stopping (by the approval it was marked with); the
    slots' caches worth keeping are saved first (deployments/kv_store.py)."""
    kv_store.save(deployment, reason)
    try:
        stop_handles(deployment, handles_of(deployment))
    except EngineUnreachable as exc:
        # The engines may well still run: the record stays as it was, with the reason.
        transition(deployment, prior, expected=[State.STOPPING], reason=str(exc), actor=actor)
        raise
    except RuntimeError_ as exc:
        transition(
            deployment, State.FAILED, expected=[State.STOPPING], reason=str(exc), actor=actor
        )
        return True
    transition(
        deployment,
        State.STOPPED,
        expected=[State.STOPPING],
        reason=reason,
        actor=actor,
        engine_urls=[],
        runtime_handle={},
        running_fingerprint="",
    )
    return True


def _post_each(deployment: Deployment, path: str) -> None:
    with httpx.Client(timeout=60.0, auth=engine_secrets.auth(deployment)) as client:
        for url in deployment.engine_urls:
            answer = client.post(url + path)
            answer.raise_for_status()


def sleep(
    deployment_id: int,
    *,
    precheck: Precheck | None = None,
    actor: str = "system",
    reason: str = "",
) -> bool:
    """Put a ready engine to sleep (vLLM sleep mode, at the level sleep_tiers.level_for
    chooses): weights and KV cache leave the GPU. An engine that takes the /sleep but stays
    awake (vLLM's CPU worker) is stopped instead, with the reason: left "asleep", it would
    hang the requests woken for it. False
    when it was not ready or the precheck refused (on the locked, freshly read row)."""
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None:
        return False
    if not get_loader(deployment.loader).can_sleep(EngineSpec.of(deployment)):
        raise CannotSleep(f"{deployment.name}: the {deployment.loader} engine cannot sleep")
    # Marked stopping before the /sleep (up to a minute), as a stop is: a request meanwhile
    # gets no slot on the engine going to sleep, and waits to wake it. The row stays marked
    # until the engine is asleep or stopped, so the stop instead runs on this approval.
    marked = _mark_stopping(deployment_id, precheck, actor, reason, only_from=(State.READY,))
    if marked is None:
        return False
    deployment, _ = marked
    level = sleep_tiers.level_for(deployment)
    try:
        _post_each(deployment, f"/sleep?level={level}")
        why = "" if _all_asleep(deployment) else "it took /sleep and stayed awake"
    except httpx.HTTPError as exc:
        why = f"its /sleep failed: {exc}"
    except BaseException:
        transition(deployment, State.READY, expected=[State.STOPPING], actor=actor)
        raise
    if _orphaned(deployment):
        return False
    if why:
        why = f"sleep not supported by this engine here ({why})"
        event(deployment, "sleep_ignored", why, actor=actor)
        return _take_down(deployment, State.READY, actor=actor, reason=f"{why}: stopping instead")
    asleep = transition(
        deployment,
        State.ASLEEP,
        expected=[State.STOPPING],
        reason=reason,
        actor=actor,
        sleep_level=level,
        asleep_gib=measured_gib(handles_of(deployment)),
    )
    if asleep:
        metrics.tier_changes.labels(deployment.name, f"asleep_{level}").inc()
        return True
    _orphaned(deployment)
    return False


def _orphaned(deployment: Deployment) -> bool:
    """Whether the row was deleted while its engine went to sleep; if so its engines are
    stopped: nothing would track them again."""
    if Deployment.objects.filter(pk=deployment.pk).exists():
        return False
    stop_orphans(deployment)
    return True


def stop_orphans(deployment: Deployment) -> None:
    """Stop the engines of a row that is gone (logged: there is no row for an event)."""
    try:
        stop_handles(deployment, handles_of(deployment))
    except (EngineUnreachable, RuntimeError_) as exc:
        log.error("%s: its engines outlived its deletion: %s", deployment.name, exc)


def _all_asleep(deployment: Deployment) -> bool:
    with httpx.Client(timeout=10.0, auth=engine_secrets.auth(deployment)) as client:
        for url in deployment.engine_urls:
            try:
                answer = client.get(url + "/is_sleeping")
                if answer.json().get("is_sleeping") is not True:
                    return False
            except (httpx.HTTPError, ValueError, AttributeError):
                return False
    return True


def rest(
    deployment_id: int,
    *,
    precheck: Precheck | None = None,
    actor: str = "system",
    reason: str = "",
) -> bool:
    """What on-demand does with an idle engine: sleep where it can, else stop."""
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None:
        return False
    if get_loader(deployment.loader).can_sleep(EngineSpec.of(deployment)):
        return sleep(deployment_id, precheck=precheck, actor=actor, reason=reason)
    stopped = stop(deployment_id, precheck=precheck, actor=actor, reason=reason)
    if stopped:
        metrics.tier_changes.labels(deployment.name, "stopped").inc()
    return stopped


def wake(
    deployment_id: int, *, actor: str = "system", on_start: Callable[[], None] | None = None
) -> Deployment:
    """Wake a sleeping engine; it takes its memory back, so it passes the fit check first.
    `on_start` is called once this call is about to wake it (it woke it)."""
    with start_gate():
        deployment = Deployment.objects.get(pk=deployment_id)
        if deployment.state != State.ASLEEP:
            return deployment
        fit_or_refuse(deployment, actor, waking=True)
        if on_start is not None:
            on_start()
        began = timezone.now()
        try:
            steps = sleep_tiers.wake_steps(deployment.sleep_level)
            sleep_tiers.call_each(
                list(deployment.engine_urls), steps, engine_secrets.auth(deployment)
            )
        except httpx.HTTPError as exc:
            stop_handles(deployment, handles_of(deployment))
            transition(
                deployment,
                State.FAILED,
                expected=[State.ASLEEP],
                reason=f"wake failed: {exc}",
                actor=actor,
                engine_urls=[],
                runtime_handle={},
            )
            return deployment
        # Held again from the wake's start, a load (openai_api/usage/held.py); said once it
        # worked, so a wake that fails or is killed leaves no held time open.
        event_at(deployment, "waking", began, actor=actor)
        transition(deployment, State.READY, expected=[State.ASLEEP], actor=actor)
        return deployment


def replace(deployment_id: int, strategy: str = "blue_green", *, actor: str = "system") -> Any:
    """Bring a running deployment onto its current configuration.

    blue_green starts the new engines beside the old ones, switches the deployment's engine
    URLs once they are healthy, then stops the old; stop_start stops first, then starts.
    Nothing happens when the running engine already has the current configuration.
    """
    deployment = Deployment.objects.get(pk=deployment_id)
    if deployment.state in STARTABLE_STATES:
        return deployment  # nothing runs: the next start takes the new configuration
    if deployment_fingerprint(deployment) == deployment.running_fingerprint:
        return deployment
    if strategy == "blue_green" and deployment.state == State.READY:
        return _blue_green(deployment, actor)
    stop(deployment_id, actor=actor, reason="replaced by a new configuration")
    return restart(deployment_id, actor=actor)


def _blue_green(deployment: Deployment, actor: str) -> Deployment:
    def refused(exc: Exception) -> StartFailed:
        event(deployment, "replace_failed", f"the old configuration keeps serving: {exc}", actor)
        return StartFailed(str(exc))

    try:
        prepare_start(deployment)  # the new configuration's image and family, before the gate
    except (RuntimeError_, engine_envs.EnvFailed) as exc:
        raise refused(exc) from exc
    with start_gate():
        deployment.refresh_from_db()
        if deployment.state != State.READY:
            return restart(deployment.pk, actor=actor)
        placed = check_fit(deployment, alongside_itself=True)
        old_handles, old_fp = handles_of(deployment), deployment.running_fingerprint
        event(deployment, "replacing", "starting the new configuration beside the old", actor)
        new_handles: list[Handle] = []
        try:
            new_handles = launch_all(deployment, placed)
            wait_healthy(deployment, new_handles, settings.MSHIP_START_TIMEOUT_S)
        except (RuntimeError_, StartFailed) as exc:
            stop_handles(deployment, new_handles)
            raise refused(exc) from exc
        switched = Deployment.objects.filter(
            pk=deployment.pk, state=State.READY, running_fingerprint=old_fp
        ).update(
            runtime_handle={"replicas": new_handles},
            engine_urls=[h["url"] for h in new_handles],
            running_fingerprint=deployment_fingerprint(deployment),
            gpus=placed,
        )
        if not switched:
            stop_handles(deployment, new_handles)
            deployment.refresh_from_db()
            return deployment
        deployment.refresh_from_db()
        event(deployment, "replaced", "now serving the new configuration", actor)
    drain(deployment, old_handles)
    stop_handles(deployment, old_handles)
    return deployment
