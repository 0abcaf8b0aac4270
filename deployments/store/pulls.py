"""Pulls: asked for by the API, the admin and `modelship pull`; run by the django-q cluster,
never in a request.

A pull writes into `<store>/.pulls/<name>/` and, once every file is there and checked, moves
the folder to `<store>/<name>/` in one rename: a model in the store is whole. At most
MSHIP_MODEL_PULLS run at once (the others wait, queued, and a pull that ends starts the
next); a second pull of a model being pulled joins it. What an interrupted pull fetched stays
for the next try (a URL resumes by Range, a Hub file from its `.incomplete`); a pull whose
worker died is found by its heartbeat and started again by the sweep.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_q.tasks import async_task

from common.redact import redact_urls
from deployments import audit
from deployments.host_access import RUN_ARBITRARY_ENGINE
from deployments.refusals import OperationRefused
from deployments.store import hub, local, web, wheels
from deployments.store.job import Job, PullFailed, disk_full, folder_size
from deployments.store.metadata import describe
from deployments.store.models import (
    STORE_NAME_PATTERN,
    STORE_NAME_RULE,
    PullState,
    StoredModel,
    store_dir,
)
from deployments.store.sources import BadSource, Source, needs_host_access, parse
from deployments.store.users import users_of, users_of_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)
FETCHERS: dict[str, Callable[[Source, Job], Path]] = {
    "hf": hub.fetch,
    "url": web.fetch,
    "wheel": wheels.fetch,
    "path": local.fetch,
}
STALE = timedelta(seconds=60)  # a pull whose heartbeat is this old lost its worker
MAX_ATTEMPTS = 3


class PullRefused(OperationRefused):
    status = 400
    code = "invalid"


class PullForbidden(OperationRefused):
    status = 403
    code = "permission_denied"


class PullConflict(OperationRefused):
    status = 409
    code = "conflict"


@dataclass(frozen=True)
class Asked:
    model: StoredModel
    created: bool  # a new pull (else one that was there: joined, or already pulled)


def staging_dir(pk: int) -> Path:
    """A pull's own folder while it runs: by its row, so a deleted pull's late cleanup never
    touches a new pull of the same name."""
    return store_dir() / ".pulls" / str(pk)


def final_dir(name: str) -> Path:
    return store_dir() / name


def ask(
    name: str,
    source_text: str,
    include: list[str] | None = None,
    *,
    actor: str = "system",
    user: object | None = None,
    may_reach_host: bool = False,
) -> Asked:
    """Queue a pull of `source_text` as `name`: refused with field errors where the source
    is bad or not this user's to pull; the pull there already where one is (joined while it
    runs, started again where it failed). Pulling (again) under a name a deployment uses
    changes what it loads: that takes the permission a new model path does. A source's
    credentials (user:password@, ?token=) are never in what this says, nor in the audit."""
    if not re.fullmatch(STORE_NAME_PATTERN, name):  # it becomes a folder's name
        raise PullRefused(STORE_NAME_RULE, {"name": [STORE_NAME_RULE]})
    try:
        source = parse(source_text, include)
    except BadSource as exc:
        raise PullRefused(str(exc), {exc.field: [str(exc)]}) from exc
    if (why := needs_host_access(source)) and not may_reach_host:
        message = f"{why} needs the deployments.run_arbitrary_engine permission"
        raise PullForbidden(message, {"source": [message]})
    if source.kind == "url" and (
        why := web.refusal(source.ref.partition("#")[0], web.pull_policy())
    ):
        shown = redact_urls(source.ref)
        raise PullRefused(f"{shown} may not be fetched: {why}", {"source": [redact_urls(why)]})
    with transaction.atomic():
        found = StoredModel.objects.select_for_update().filter(name=name).first()
        if found is not None:
            if found.source != source_text or found.include != list(source.include):
                shown = redact_urls(found.source)
                message = f"{name!r} is already in the store, pulled from {shown}"
                raise PullConflict(message, {"name": [message]})
            if found.state == PullState.FAILED:
                refuse_in_use(name, may_reach_host, found.path)
                found.state, found.error, found.attempts = PullState.QUEUED, "", 0
                found.host_access = found.host_access or may_reach_host
                found.save(update_fields=["state", "error", "attempts", "host_access"])
                transaction.on_commit(lambda: queue(found.pk))
            return Asked(found, created=False)
        busy = StoredModel.objects.filter(
            source=source_text, state__in=(PullState.QUEUED, PullState.PULLING)
        ).first()
        if busy is not None:
            message = f"that source is being pulled already, as {busy.name!r}"
            raise PullConflict(message, {"source": [message]})
        refuse_in_use(name, may_reach_host)
        if final_dir(name).exists():  # left by a pull whose row went: not this one's
            message = f"the store holds a folder {name!r} no stored model owns: remove it first"
            raise PullConflict(message, {"name": [message]})
        try:
            with transaction.atomic():
                model = StoredModel.objects.create(
                    name=name,
                    source=source_text,
                    include=list(source.include),
                    created_by=actor,
                    host_access=may_reach_host,
                )
        except IntegrityError as exc:  # the same name asked at the same moment
            message = f"{name!r} is being pulled already"
            raise PullConflict(message, {"name": [message]}) from exc
        audit.record(
            "store.pull",
            None,
            user=user,
            actor=actor,
            object_repr=f"model {name}",
            after={"source": redact_urls(source_text), "include": list(source.include)},
        )
        transaction.on_commit(lambda: queue(model.pk))
    return Asked(model, created=True)


def refuse_in_use(name: str, may_reach_host: bool, *paths: str) -> None:
    """PullForbidden where a deployment names `name` (by reference or by a path into its
    folder) and the user may not reach the host: what the pull fetches becomes what that
    deployment loads (with its trust_remote_code, say), as a new model path would."""
    if may_reach_host or not (users := users_of_name(name, *paths)):
        return
    message = (
        f"{name!r} is used by {', '.join(users)}: pulling it anew changes what they load,"
        f" which needs the {RUN_ARBITRARY_ENGINE} permission"
    )
    raise PullForbidden(message, {"name": [message]})


def queue(pk: int) -> None:
    # In the pulls' own cluster (MSHIP_PULLS_CLUSTER), with its own time limit: a model of
    # tens of GiB takes longer than an engine's start, and holds none of the main workers.
    async_task(
        run,
        pk,
        group="store-pulls",
        timeout=int(settings.MSHIP_MODEL_PULL_TIMEOUT_S),
        cluster=settings.MSHIP_PULLS_CLUSTER,
    )


@contextlib.contextmanager
def claims_lock() -> Iterator[None]:
    """One process at a time counts the running pulls and claims a slot (a file lock: the
    store is one host's disk, shared by every Modelship process on it)."""
    folder = Path(settings.MSHIP_RUN_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "store-pulls.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def free_slots() -> int:
    """MSHIP_MODEL_PULLS less the pulls running (a stale heartbeat's is the sweep's to queue
    again, not a slot taken)."""
    running = StoredModel.objects.filter(
        state=PullState.PULLING, heartbeat_at__gte=timezone.now() - STALE
    ).count()
    return int(settings.MSHIP_MODEL_PULLS) - running


def claim(pk: int) -> StoredModel | None:
    """The queued pull, now pulling, where a slot is free; None where it is not queued or
    every slot is taken (a pull that ends starts it)."""
    with claims_lock(), transaction.atomic():
        model = StoredModel.objects.select_for_update().filter(pk=pk).first()
        if model is None or model.state != PullState.QUEUED:
            return None
        if free_slots() <= 0:
            return None
        model.state, model.error = PullState.PULLING, ""
        model.started_at = model.heartbeat_at = timezone.now()
        model.attempts += 1
        model.save(update_fields=["state", "error", "started_at", "heartbeat_at", "attempts"])
        return model


def run(pk: int) -> str:
    """The django-q task: the pull, start to end, then the next queued one."""
    model = claim(pk)
    if model is None:
        return "not started"
    try:
        outcome = pull(model)
    finally:
        start_next()
    return outcome


def pull(model: StoredModel) -> str:
    staging = staging_dir(model.pk)
    source = parse(model.source, model.include)
    landed: Path | None = None
    try:
        with Job(model.pk, staging, model.host_access) as job:
            root = FETCHERS[source.kind](source, job)
            job.check()
            described = describe(root)
            primary = described.primary.relative_to(root) if root.is_dir() else Path(root.name)
        landed = land(model.name, staging)
        size = folder_size(landed)
        updated = StoredModel.objects.filter(pk=model.pk, state=PullState.PULLING).update(
            state=PullState.READY,
            path=str(landed / primary).removesuffix("/."),
            format=described.format,
            details=described.details,
            size_bytes=size,
            bytes_done=size,
            bytes_total=size,
            checksums=job.checksums,
            rate_bps=None,
            finished_at=timezone.now(),
        )
    except PullFailed as exc:
        unland(landed, staging)
        return fail(model, str(exc), keep=exc.keep)
    except Exception as exc:
        unland(landed, staging)
        if disk_full(exc):
            return fail(model, f"the store's disk is full ({exc}); nothing was kept", keep=False)
        log.exception("pull %s failed", model.name)
        # Masked before it is cut: a URL cut in its credentials would not be seen as one.
        return fail(model, f"{type(exc).__name__}: {redact_urls(str(exc))[:500]}", keep=True)
    if not updated:  # deleted as it landed
        shutil.rmtree(landed, ignore_errors=True)
        return "deleted"
    log.info("pulled %s from %s: %s", model.name, redact_urls(model.source), described.format)
    return "ready"


def land(name: str, staging: Path) -> Path:
    """The pulled files moved from their staging folder into the store, in one rename onto
    a name nothing holds (a folder there is never replaced)."""
    final = final_dir(name)
    if final.exists():
        raise PullFailed(f"the store holds a folder {name!r} already; nothing replaced it")
    os.rename(staging, final)
    return final


def unland(landed: Path | None, staging: Path) -> None:
    """A pull that failed after it landed (its row could not be written): its files go back
    to its own folder, for the next try."""
    if landed is not None and landed.exists() and not staging.exists():
        os.rename(landed, staging)


def fail(model: StoredModel, message: str, *, keep: bool) -> str:
    """The pull failed: its error, with no URL's credentials (the row is shown to whoever
    may view the store; the task's result is kept by the cluster)."""
    message = redact_urls(message)
    if not keep:
        shutil.rmtree(staging_dir(model.pk), ignore_errors=True)
    updated = StoredModel.objects.filter(pk=model.pk).update(
        state=PullState.FAILED, error=message[:4000], rate_bps=None, finished_at=timezone.now()
    )
    if not updated:
        shutil.rmtree(staging_dir(model.pk), ignore_errors=True)
        return "deleted"
    log.warning("pull of %s failed: %s", model.name, message)
    return f"failed: {message}"


def start_next() -> None:
    """The oldest queued pulls, as many as there are free slots: the pulls' cluster has one
    worker a slot, so a task queued for a slot that is not free would only wait there."""
    free = free_slots()
    if free <= 0:
        return
    for pk in (
        StoredModel.objects.filter(state=PullState.QUEUED)
        .order_by("created")
        .values_list("pk", flat=True)[:free]
    ):
        queue(pk)


def sweep() -> int:
    """The schedule's pass: a pull whose worker died (its heartbeat stale) is queued again,
    to resume, up to MAX_ATTEMPTS starts (a model whose pull kills its worker every time
    fails instead); queued pulls are offered a slot. Returns how many were requeued."""
    stale = StoredModel.objects.filter(
        state=PullState.PULLING, heartbeat_at__lt=timezone.now() - STALE
    )
    stale.filter(attempts__gte=MAX_ATTEMPTS).update(
        state=PullState.FAILED,
        error=f"its worker stopped {MAX_ATTEMPTS} times without finishing it",
        finished_at=timezone.now(),
    )
    again = stale.update(state=PullState.QUEUED)
    start_next()
    return again


def remove(model: StoredModel, *, actor: str = "system", user: object | None = None) -> None:
    """Delete a stored model and its files; refused while a deployment names it. A pull in
    flight stops at its next chunk (its reporter finds the row gone)."""
    if users := users_of(model):
        message = f"{model.name!r} is used by {', '.join(users)}: change or delete them first"
        raise PullConflict(message, {"name": [message]})
    StoredModel.objects.filter(pk=model.pk).delete()
    if model.path:  # it landed: its folder is the store's own (else it may not be)
        shutil.rmtree(final_dir(model.name), ignore_errors=True)
    shutil.rmtree(staging_dir(model.pk), ignore_errors=True)
    audit.record(
        "store.delete",
        None,
        user=user,
        actor=actor,
        object_repr=f"model {model.name}",
        before={"source": redact_urls(model.source), "path": model.path},
    )
