"""Applying a models.yaml: add and update, or reconcile to match it exactly.

The database changes happen in one transaction, each audited; the engine work they call for
(start, replace, remove) is returned as jobs for the caller to run or enqueue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from deployments import audit, host_access
from deployments.fingerprint import CONFIG_FIELDS
from deployments.models import STARTABLE_STATES, Deployment
from deployments.validation import name_clashes

# Model fields a models.yaml sets; a field the file leaves out goes back to its default.
FILE_FIELDS = (*CONFIG_FIELDS, "mode", "idle_timeout_s", "system")


@dataclass
class Job:
    action: str  # start | replace | remove
    deployment_id: int
    name: str


@dataclass
class Outcome:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)


def defaults() -> dict[str, Any]:
    return {
        f.name: f.get_default()
        for f in Deployment._meta.get_fields()
        if f.name in FILE_FIELDS and hasattr(f, "get_default")
    }


def clashes_with_others(entries: list[dict[str, Any]], *, reconcile: bool) -> list[str]:
    """Served names the file claims that a deployment it does not name already serves."""
    if reconcile:
        return []  # those deployments are removed
    named = {values["name"] for values in entries}
    others = Deployment.objects.exclude(name__in=named).only("name", "aliases")
    return name_clashes(
        [(values["name"], list(values.get("aliases") or [])) for values in entries],
        [(d.name, list(d.aliases or [])) for d in others],
    )


def apply(
    entries: list[dict[str, Any]], *, reconcile: bool, actor: str, user: Any = None
) -> Outcome:
    """Apply the file in one transaction. With a `user`, only what that user may change:
    one entry that sets what runs on the host without the permission undoes it all
    (HostAccessDenied)."""
    outcome = Outcome()
    base = defaults()
    with transaction.atomic():
        existing = {d.name: d for d in Deployment.objects.select_for_update()}
        for values in entries:
            wanted = {**base, **values}
            current = existing.get(wanted["name"])
            host_access.check(user, current.snapshot() if current else None, wanted)
            if current is None:
                deployment = Deployment.objects.create(**wanted)
                audit.record(
                    "create", deployment, user=user, actor=actor, after=deployment.snapshot()
                )
                outcome.created.append(deployment.name)
                if deployment.effective_mode == "always_on":
                    outcome.jobs.append(Job("start", deployment.pk, deployment.name))
                continue
            changed = {k: v for k, v in wanted.items() if getattr(current, k) != v}
            if changed:
                before = current.snapshot()
                for key, value in changed.items():
                    setattr(current, key, value)
                current.save()
                audit.record(
                    "update",
                    current,
                    user=user,
                    actor=actor,
                    before=before,
                    after=current.snapshot(),
                )
                outcome.updated.append(current.name)
            else:
                outcome.unchanged.append(current.name)
            if current.state not in STARTABLE_STATES:
                outcome.jobs.append(Job("replace", current.pk, current.name))
            elif current.effective_mode == "always_on":
                outcome.jobs.append(Job("start", current.pk, current.name))
        if reconcile:
            named = {values["name"] for values in entries}
            for name, deployment in existing.items():
                if name not in named:
                    outcome.removed.append(name)
                    outcome.jobs.append(Job("remove", deployment.pk, name))
    return outcome
