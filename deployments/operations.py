"""Every change an operator makes to a deployment, whichever door it comes through.

The admin, /api and `manage.py deploy` (models.yaml) change deployments only here: create,
update, remove, start, stop, sleep, wake and set_mode. Each one refuses first, with an
`OperationRefused` and nothing changed; writes and audits in one transaction; and hands the
engine work it calls for to `work`: the django-q queue by default (after the commit), or a
collector that runs it in place (`manage.py deploy --wait`). The caller answers without
waiting for the engine.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from deployments import audit, hooks, host_access, tasks
from deployments.adapters import AdapterHasNoEngine, BaseHasAdapters, base_problems
from deployments.fingerprint import CONFIG_FIELDS, deployment_fingerprint
from deployments.loaders import EngineSpec, get_loader
from deployments.memory import check_fit, check_fit_where
from deployments.models import STARTABLE_STATES, Deployment, Mode, State, effective_mode_of
from deployments.refusals import CannotSleep, Gone, InvalidConfiguration, InvalidState
from deployments.task_queue import Work, enqueue
from deployments.validation import cross_field_problems, name_clashes

if TYPE_CHECKING:
    from collections.abc import Mapping

# A change of these voids the memory an out-of-memory start taught (Deployment.learned_gib).
SIZED_BY = {"model", "config", "memory_gib", "num_gpus", "loader"}
# What an operator sets on a deployment (the rest is its state).
SETTABLE_FIELDS = (
    *CONFIG_FIELDS,
    "mode",
    "idle_timeout_s",
    "evictable",
    "preload",
    "priority",
    "max_concurrency",
    "system",
    "responses",
    "autoscaling_config",
    "adapter_of",
)


class Outcome(StrEnum):
    """What an operation answers when it is not refused (besides a state it is already in)."""

    QUEUED = "queued"  # the engine work is queued for the cluster
    DELETED = "deleted"  # removed at once: nothing ran


def settable(deployment: Deployment) -> dict[str, Any]:
    return {field: getattr(deployment, field) for field in SETTABLE_FIELDS}


def check(
    deployment: Deployment | None,
    changes: Mapping[str, Any],
    user: Any,
    *,
    check_names: bool = True,
) -> None:
    """Refuse what create (no deployment) or update would refuse, changing nothing: the
    admin's form asks this before it saves, so it shows what /api answers. A models.yaml
    has its served names checked as a whole before (`check_names=False`)."""
    merged = {**(settable(deployment) if deployment else {}), **changes}
    # Whether the user may set it comes before whether it is right.
    host_access.check(user, deployment.snapshot() if deployment else None, merged)
    problems = cross_field_problems(merged)
    if deployment is not None:
        for field, message in base_problems(deployment, dict(changes)):
            problems.setdefault(field, []).append(message)
    if check_names:
        others = Deployment.objects.only("name", "aliases")
        if deployment is not None:
            others = others.exclude(pk=deployment.pk)
        clashes = name_clashes(
            [(merged.get("name", ""), list(merged.get("aliases") or []))],
            [(d.name, list(d.aliases or [])) for d in others],
        )
        if clashes:
            problems.setdefault("aliases", []).extend(clashes)
    if problems:
        raise InvalidConfiguration(problems)
    if deployment is not None:
        switch = mode_switch(deployment, changes)
        if switch is not None:
            check_mode(deployment, switch)


def create(
    deployment: Deployment, user: Any, *, actor: str | None = None, check_names: bool = True
) -> Deployment:
    """Save a new deployment (built but unsaved by the caller's form or file)."""
    check(None, settable(deployment), user, check_names=check_names)
    with transaction.atomic():
        deployment.save()
        audit.record("create", deployment, user=user, actor=actor, after=deployment.snapshot())
        refit_base(deployment.adapter_of_id, user, actor, enqueue)
    return deployment


def refit_base(base_id: int | None, user: Any, actor: str | None, work: Work) -> None:
    """A running base whose adapters changed is replaced, as any change of what shapes its
    engine replaces it (llama.cpp loads its adapters when it starts)."""
    base = Deployment.objects.filter(pk=base_id).first() if base_id else None
    running = base.running_fingerprint if base is not None else ""
    if base is not None and running and running != deployment_fingerprint(base):
        chosen = settings.MSHIP_REPLACE_STRATEGY
        work(tasks.replace, base.pk, chosen, audit.actor_of(user, actor))


def no_engine_of_its_own(deployment: Deployment) -> None:
    if deployment.adapter_of_id is not None:
        raise AdapterHasNoEngine(deployment)


def update(
    deployment: Deployment,
    user: Any,
    *,
    actor: str | None = None,
    work: Work = enqueue,
    strategy: str | None = None,
    check_names: bool = True,
) -> Deployment:
    """Save what the caller changed on `deployment` (in memory, unsaved).

    A running engine whose configuration changed is replaced with `strategy` (the site's
    MSHIP_REPLACE_STRATEGY by default); a change of the effective mode goes through
    set_mode, audited as ondemand_mode; a new configuration forgives past start failures.
    """
    with transaction.atomic():
        current = Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
        if current is None:  # removed since the caller read it
            raise Gone(deployment.pk)
        wanted, had = settable(deployment), settable(current)
        changes = {field: value for field, value in wanted.items() if value != had[field]}
        check(current, changes, user, check_names=check_names)
        switch = mode_switch(current, changes)
        if switch is not None:
            changes.pop("mode", None)  # set_mode writes it, with its pending start
        if changes:
            before = current.snapshot()
            for field, value in changes.items():
                setattr(current, field, value)
            if changes.keys() & SIZED_BY:
                # Another model or size: what was learned and measured is moot.
                current.learned_gib, current.learned_on, current.measured_gib = None, "", None
            current.save()
            audit.record(
                "update", current, user=user, actor=actor, before=before, after=current.snapshot()
            )
            forgive_start_failures(current)
            running = current.running_fingerprint
            if running and running != deployment_fingerprint(current):
                chosen = strategy or settings.MSHIP_REPLACE_STRATEGY
                work(tasks.replace, current.pk, chosen, audit.actor_of(user, actor))
            for base_id in {had["adapter_of"] and had["adapter_of"].pk, current.adapter_of_id}:
                refit_base(base_id, user, actor, work)
        if switch is not None:
            current = set_mode(current, switch, user, actor=actor, work=work)
    return current


def mode_switch(deployment: Deployment, changes: Mapping[str, Any]) -> str | None:
    """The effective mode `changes` switch the deployment to, or None when they keep it (a
    change of something else leaves a waiting switch alone)."""
    if not {"mode", "system", "autoscaling_config"} & changes.keys():
        return None
    values = {**settable(deployment), **changes}
    wanted = effective_mode_of(values["mode"], values["system"], values["autoscaling_config"])
    changed = wanted != deployment.effective_mode
    return wanted if changed or deployment.pending_mode not in (None, wanted) else None


def forgive_start_failures(deployment: Deployment) -> None:
    """Past start failures no longer hold back its next on-demand start, in every gateway
    process: their controllers see the count raised on the row they read before a start."""
    Deployment.objects.filter(pk=deployment.pk).update(failures_forgiven=F("failures_forgiven") + 1)


def check_mode(deployment: Deployment, mode: str) -> None:
    if deployment.system and mode == Mode.ON_DEMAND:
        raise InvalidState(f"{deployment.name} is a system deployment and is always on")
    if needs_start(deployment, mode):
        check_fit(deployment)


def needs_start(deployment: Deployment, mode: str) -> bool:
    return mode == Mode.ALWAYS_ON and deployment.state in (*STARTABLE_STATES, State.ASLEEP)


def in_mode(deployment: Deployment, mode: str) -> bool:
    """Whether a switch to `mode` has nothing to do: set so, no switch waiting, no start."""
    return (
        deployment.mode == mode
        and not deployment.pending_mode
        and not needs_start(deployment, mode)
    )


def set_mode(
    deployment: Deployment,
    mode: str,
    user: Any,
    *,
    actor: str | None = None,
    work: Work = enqueue,
) -> Deployment:
    """Switch between on demand and always on, audited as ondemand_mode (not an adapter's:
    its base's mode is its own).

    A switch to always on of a deployment that does not run starts it first and keeps it
    on demand with pending_mode set until the start ends, so its name never stops being
    served; a start that cannot fit is refused and changes nothing. Every switch forgives
    past start failures and tells LiteLLM; one to on demand restarts the idle timer.
    """
    no_engine_of_its_own(deployment)
    check_mode(deployment, mode)
    if in_mode(deployment, mode):
        return deployment  # nothing to switch: no audit row
    old = deployment.effective_mode
    start = needs_start(deployment, mode)
    with transaction.atomic():
        if start and old == Mode.ON_DEMAND:
            updated = Deployment.objects.filter(pk=deployment.pk).update(pending_mode=mode)
        else:
            changes: dict[str, Any] = {"mode": mode, "pending_mode": None}
            if mode == Mode.ON_DEMAND:
                idle = deployment.effective_idle_timeout_s
                changes["lease_until"] = timezone.now() + timedelta(seconds=idle)
            updated = Deployment.objects.filter(pk=deployment.pk).update(**changes)
        if not updated:  # removed since the caller read it: no audit row for nothing
            raise Gone(deployment.pk)
        deployment.refresh_from_db()
        forgive_start_failures(deployment)
        audit.record(
            "ondemand_mode",
            deployment,
            user=user,
            actor=actor,
            before={"mode": old},
            after={"mode": mode, "pending_mode": deployment.pending_mode},
        )
        hooks.listing_has_changed()  # the mode changes where LiteLLM sends the name
        if start:
            task = tasks.wake if deployment.state == State.ASLEEP else tasks.start
            work(task, deployment.pk, audit.actor_of(user, actor))
    return deployment


def lock_present(deployment: Deployment) -> None:
    """Lock the deployment's row for the rest of the transaction, so that a DELETE cannot
    land between this check and the audit row that names it; Gone when one already has."""
    if not Deployment.objects.select_for_update().filter(pk=deployment.pk).exists():
        raise Gone(deployment.pk)


def start(deployment: Deployment, user: Any, *, work: Work = enqueue) -> str:
    """Queue a start; raises InsufficientMemory when it cannot fit now."""
    no_engine_of_its_own(deployment)
    if deployment.state not in STARTABLE_STATES:
        return deployment.state
    check_fit(deployment)
    with transaction.atomic():
        lock_present(deployment)
        audit.record("start", deployment, user=user)
        work(tasks.start, deployment.pk, audit.actor_of(user, None))
    return Outcome.QUEUED


def stop(deployment: Deployment, user: Any, *, work: Work = enqueue) -> str:
    no_engine_of_its_own(deployment)
    if deployment.state in (State.PLANNED, State.STOPPED, State.STOPPING):
        return deployment.state
    actor = audit.actor_of(user, None)
    with transaction.atomic():
        lock_present(deployment)
        audit.record("stop", deployment, user=user)
        work(tasks.stop, deployment.pk, actor, f"stopped by {actor}")
    return Outcome.QUEUED


def sleep(deployment: Deployment, user: Any, *, work: Work = enqueue) -> str:
    no_engine_of_its_own(deployment)
    if not get_loader(deployment.loader).can_sleep(EngineSpec.of(deployment)):
        raise CannotSleep(f"the {deployment.loader} engine of {deployment.name} cannot sleep")
    if deployment.state != State.READY:
        raise InvalidState(
            f"{deployment.name} is {deployment.state}; only a ready one can sleep",
            deployment.state,
        )
    with transaction.atomic():
        lock_present(deployment)
        audit.record("sleep", deployment, user=user)
        work(tasks.sleep, deployment.pk, audit.actor_of(user, None))
    return Outcome.QUEUED


def wake(deployment: Deployment, user: Any, *, work: Work = enqueue) -> str:
    no_engine_of_its_own(deployment)
    if deployment.state != State.ASLEEP:
        raise InvalidState(
            f"{deployment.name} is {deployment.state}; only an asleep one wakes", deployment.state
        )
    check_fit_where(deployment, deployment.gpus or [])  # it wakes where it ran
    with transaction.atomic():
        lock_present(deployment)
        audit.record("wake", deployment, user=user)
        work(tasks.wake, deployment.pk, audit.actor_of(user, None))
    return Outcome.QUEUED


def remove(
    deployment: Deployment, user: Any, *, actor: str | None = None, work: Work = enqueue
) -> str:
    """Delete at once when nothing runs; else stop the engine first (queued)."""
    actor = audit.actor_of(user, actor)
    if names := list(deployment.adapters.order_by("name").values_list("name", flat=True)):
        raise BaseHasAdapters(deployment, names)
    with transaction.atomic():
        if deployment.state in (State.PLANNED, State.STOPPED, State.FAILED):
            base_id = deployment.adapter_of_id
            audit.record("delete", deployment, user=user, before=deployment.snapshot())
            deployment.delete()
            refit_base(base_id, user, actor, work)
            hooks.listing_has_changed()  # its entries leave LiteLLM
            return Outcome.DELETED
        work(tasks.remove, deployment.pk, actor)
    return Outcome.QUEUED
