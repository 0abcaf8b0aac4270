"""Queueing engine work for the django-q cluster, once the current transaction commits."""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django_q.tasks import async_task

# The engine work an operation calls for: (task function, deployment id, *its arguments).
# The queue below by default; `manage.py deploy --wait` collects it to run in place.
Work = Callable[..., None]


def enqueue(task: Callable[..., object], deployment_id: int, *args: object) -> None:
    """Queue `task(deployment_id, *args)` once the current transaction commits (a rollback
    queues nothing); one group per deployment."""

    def send() -> None:
        async_task(task, deployment_id, *args, group=f"deployment-{deployment_id}")

    transaction.on_commit(send)
