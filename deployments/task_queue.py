"""Queueing a deployment's engine work for the django-q cluster (deployments/tasks.py)."""

from __future__ import annotations

from django.db import transaction


def enqueue(task: str, *args: object) -> None:
    """Queue a task of deployments/tasks.py once the current transaction commits (a
    rollback queues nothing); one group per deployment."""
    from django_q.tasks import async_task  # django-q reads its broker settings at import

    def send() -> None:
        async_task(f"deployments.tasks.{task}", *args, group=f"deployment-{args[0]}")

    transaction.on_commit(send)
