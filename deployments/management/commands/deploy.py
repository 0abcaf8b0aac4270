"""manage.py deploy -f models.yaml [--reconcile] [--replace-strategy S] [--wait]"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ObjectDoesNotExist
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from deployments import tasks
from deployments.apply import Job, apply, clashes_with_others
from deployments.models import Deployment, State
from deployments.models_yaml import ModelsFileError, load
from deployments.refusals import OperationRefused
from deployments.task_queue import enqueue

if TYPE_CHECKING:
    from collections.abc import Iterator

ACTOR = "cli:deploy"
PROGRESS_EVERY_S = 0.5


class Command(BaseCommand):
    help = "Add and update deployments from a models.yaml (or make them match it with --reconcile)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-f", "--file", required=True, help="the models.yaml to apply")
        parser.add_argument(
            "--reconcile", action="store_true", help="remove deployments the file does not name"
        )
        parser.add_argument(
            "--replace-strategy",
            choices=["blue_green", "stop_start"],
            help="how a running engine takes a new configuration (default: the site's"
            " MSHIP_REPLACE_STRATEGY)",
        )
        parser.add_argument(
            "--user",
            help="apply as this user, with that user's permissions (and audited as them): a"
            " file that sets what runs on the host needs deployments.run_arbitrary_engine",
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help="run the engine work here and block until every touched deployment is "
            "ready or failed (else it is queued for the django-q cluster)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            entries = load(options["file"])
            clashes = clashes_with_others(entries, reconcile=options["reconcile"])
            if clashes:
                raise ModelsFileError(
                    [
                        *clashes,
                        "a served name belongs to one deployment: rename or delete the one"
                        " that holds it (the admin, or DELETE /api/deployments/<id>/), or"
                        " deploy with --reconcile to make the deployments this file exactly",
                    ]
                )
        except ModelsFileError as exc:
            raise CommandError(
                f"{options['file']}: nothing was changed.\n"
                + "\n".join(f"  - {p}" for p in exc.problems)
            ) from exc
        user = self.user(options["user"])
        actor = user.get_username() if user is not None else ACTOR
        try:
            outcome = apply(
                entries,
                reconcile=options["reconcile"],
                actor=actor,
                user=user,
                strategy=options["replace_strategy"],
            )
        except OperationRefused as exc:
            raise CommandError(f"{options['file']}: nothing was changed: {exc}") from exc
        for label in ("created", "updated", "unchanged", "removed"):
            names = getattr(outcome, label)
            if names:
                self.stdout.write(f"{label}: {', '.join(names)}")
        if options["wait"]:
            failed = self.run_jobs(outcome.jobs)
            if failed:
                raise CommandError("not ready: " + ", ".join(failed))
        else:
            for job in outcome.jobs:
                enqueue(job.task, job.deployment_id, *job.args)

    @contextlib.contextmanager
    def telling_progress(self, deployment_id: int) -> Iterator[None]:
        """While a job runs, what its deployment's state reason says as it changes: an
        image pull's layers and bytes, an engine environment's install."""
        done = threading.Event()

        def watch() -> None:
            told = ""
            try:
                while not done.wait(PROGRESS_EVERY_S):
                    row = Deployment.objects.filter(pk=deployment_id).first()
                    line = row.state_reason.split("\n", 1)[0] if row else ""
                    if line and line != told and row is not None:
                        self.stdout.write(f"{row.name}: {line}")
                        told = line
            finally:
                connection.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    @staticmethod
    def user(name: str | None) -> Any:
        if name is None:
            return None
        try:
            return get_user_model().objects.get(username=name)
        except ObjectDoesNotExist as exc:
            raise CommandError(f"no user {name!r}") from exc

    def run_jobs(self, jobs: list[Job]) -> list[str]:
        failed = []
        for job in jobs:
            with self.telling_progress(job.deployment_id):
                result = job.run()
            if job.task is tasks.remove:
                continue
            deployment = Deployment.objects.get(pk=job.deployment_id)
            self.stdout.write(f"{deployment.name}: {deployment.state} {result}".rstrip())
            if deployment.state != State.READY and not (
                deployment.is_on_demand and deployment.state in (State.PLANNED, State.STOPPED)
            ):
                failed.append(f"{deployment.name} ({deployment.state}: {result})")
        return failed
