"""Applying a models.yaml: add and update, or reconcile to match it exactly.

The database changes go through deployments/operations.py in one transaction, each audited;
the engine work they call for (start, replace, remove) is collected as jobs for the caller
to run in place or enqueue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from deployments import operations, tasks
from deployments.models import STARTABLE_STATES, Deployment, Mode
from deployments.validation import name_clashes

if TYPE_CHECKING:
    from collections.abc import Callable

# Model fields a models.yaml sets; a field the file leaves out goes back to its default.
FILE_FIELDS = operations.SETTABLE_FIELDS


@dataclass
class Job:
    task: Callable[..., object]  # a function of deployments/tasks.py
    deployment_id: int
    args: tuple[object, ...] = ()

    def run(self) -> object:
        return self.task(self.deployment_id, *self.args)


class Jobs(list[Job]):
    """The engine work of one file: an operation's `work`, each task once per deployment."""

    def __call__(self, task: Callable[..., object], deployment_id: int, *args: object) -> None:
        if not any(j.task is task and j.deployment_id == deployment_id for j in self):
            self.append(Job(task, deployment_id, args))

    def in_start_order(self) -> None:
        """Removals first (they free memory), then starts one at a time by tensor-parallel
        size, largest first (the seed's order: whole GPUs are easiest to find on an empty
        host), the file's order among equals. Placement is decided in this order."""
        ids = {job.deployment_id for job in self}
        gpus = dict(Deployment.objects.filter(pk__in=ids).values_list("pk", "num_gpus"))
        adapters = set(
            Deployment.objects.filter(pk__in=ids, adapter_of__isnull=False).values_list(
                "pk", flat=True
            )
        )

        def order(job: Job) -> tuple[int, float]:
            if job.task is tasks.remove:  # adapters before their bases
                return (0, 0.0 if job.deployment_id in adapters else 1.0)
            size = gpus.get(job.deployment_id) or 0.0
            return (1, -size if size > 1 else 0.0)

        self.sort(key=order)


@dataclass
class Outcome:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    jobs: Jobs = field(default_factory=Jobs)


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
    entries: list[dict[str, Any]],
    *,
    reconcile: bool,
    actor: str,
    user: Any = None,
    strategy: str | None = None,
) -> Outcome:
    """Apply the file in one transaction. With a `user`, only what that user may change:
    one entry that the operations refuse (OperationRefused: a host setting without the
    permission, a start that cannot fit) undoes it all."""
    outcome = Outcome()
    jobs = outcome.jobs
    base = defaults()
    with transaction.atomic():
        existing = {d.name: d for d in Deployment.objects.select_for_update()}
        # Bases before their adapters, which name them by the saved row.
        for values in sorted(entries, key=lambda v: v.get("adapter_of") is not None):
            wanted = {**base, **values}
            if (of := wanted.get("adapter_of")) is not None:
                wanted["adapter_of"] = Deployment.objects.get(name=of.name)
            current = existing.get(wanted["name"])
            if current is None:
                current = Deployment(**wanted)
                operations.create(current, user, actor=actor, check_names=False)
                outcome.created.append(current.name)
            elif any(getattr(current, k) != v for k, v in wanted.items()):
                for key, value in wanted.items():
                    setattr(current, key, value)
                current = operations.update(
                    current, user, actor=actor, work=jobs, strategy=strategy, check_names=False
                )
                outcome.updated.append(current.name)
            else:
                outcome.unchanged.append(current.name)
            if current.state not in STARTABLE_STATES:
                # Nothing happens when the engine already runs this configuration.
                jobs(tasks.replace, current.pk, strategy or settings.MSHIP_REPLACE_STRATEGY, actor)
            elif current.effective_mode == Mode.ALWAYS_ON and current.adapter_of_id is None:
                jobs(tasks.start, current.pk, actor)
        if reconcile:
            named = {values["name"] for values in entries}
            for name, deployment in existing.items():
                if name not in named:
                    outcome.removed.append(name)
                    jobs(tasks.remove, deployment.pk, actor)
        jobs.in_start_order()
    return outcome
