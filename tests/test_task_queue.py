"""The API answers at once and a real django-q cluster, in its own process, does the work."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import Success
from django_q.tasks import async_task
from rest_framework.test import APIClient

from deployments import tasks
from deployments.models import Deployment, DeploymentEvent, State
from deployments.store.models import PullState, StoredModel
from tests.conftest import REPO, env_for_subprocess, reply_of, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.store_support import Store

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.redis]


@pytest.fixture
def cluster(transactional_db: None, site: Any, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    get_broker().purge_queue()  # tasks other tests queued and no cluster ran
    env = env_for_subprocess(
        MSHIP_Q_NAME=Conf.PREFIX,
        MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR),
        MSHIP_ENGINE_LOG_DIR=str(site.MSHIP_ENGINE_LOG_DIR),
        MSHIP_MEMORY_CAPACITY_GIB="8",
    )
    yield from qcluster(env, tmp_path / "cluster.log")


def qcluster(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A django-q cluster in its own process (the one `env` names), stopped after the test."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"], cwd=REPO, env=env, stdout=out, stderr=out
        )
        yield process
        process.terminate()
        process.wait(30)


@pytest.fixture
def api(transactional_db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    return client


def test_it_answers_202_at_once_and_the_cluster_starts_the_engine(
    api: APIClient, cluster: Any
) -> None:
    deployment = Deployment.objects.create(
        name="queued",
        model="m",
        loader="simulated",
        memory_gib=1,
        config={"startup_delay_s": 1, "reply": "from the cluster"},
    )
    answer = api.post(f"/api/deployments/{deployment.pk}/start/")
    assert answer.status_code == 202
    deployment.refresh_from_db()
    assert deployment.state in (State.PLANNED, State.STARTING)  # it did not wait

    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == State.READY, 60)
    deployment.refresh_from_db()
    assert reply_of(deployment.engine_url) == "from the cluster"

    assert api.post(f"/api/deployments/{deployment.pk}/stop/").status_code == 202
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == State.STOPPED, 60)


def test_it_starts_once_for_twenty_concurrent_api_starts(api: APIClient, cluster: Any) -> None:
    deployment = Deployment.objects.create(
        name="burst",
        model="m",
        loader="simulated",
        memory_gib=1,
        config={"startup_delay_s": 0.5},
    )
    codes: list[int] = []
    barrier = threading.Barrier(20)

    def start() -> None:
        barrier.wait()
        codes.append(api.post(f"/api/deployments/{deployment.pk}/start/").status_code)
        connection.close()

    threads = [threading.Thread(target=start) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(codes) == 20 and set(codes) <= {200, 202}
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == State.READY, 60)
    # Let every queued start run: each finds the engine up and does nothing.

    wait_until(lambda: not get_broker().queue_size(), 60)
    assert DeploymentEvent.objects.filter(deployment=deployment, kind="starting").count() == 1
    deployment.refresh_from_db()
    assert len(deployment.runtime_handle["replicas"]) == 1


@pytest.mark.parametrize("task", ["start", "replace", "wake"])
def test_it_drops_a_queued_task_whose_deployment_was_removed_meanwhile(
    task: str, make_deployment: Any
) -> None:
    """A task that waited in the queue while its deployment was removed ends as "gone"
    (the cluster logs no error, and runs the next)."""
    removed = make_deployment("removed-meanwhile")
    pk = removed.pk
    removed.delete()
    assert getattr(tasks, task)(pk) == "gone"


def test_it_stops_at_once_while_the_reaper_waits_between_passes(
    cluster: subprocess.Popen[bytes],
) -> None:
    """The on-demand reaper spends most of each minute waiting between its passes in a
    worker; a stopping cluster waits for its workers' tasks, so that wait used to hold up
    `serve`'s shutdown until it killed the cluster (15 s). Asked to stop, the reaper ends
    after the pass under way and its result is kept."""
    async_task("ondemand.tasks.reap", task_name="reap-before-stop")
    wait_until(lambda: not get_broker().queue_size(), 60)  # a worker took it
    cluster.terminate()
    cluster.wait(10)  # the reaper's next pass was due 15 s after its first
    assert cluster.returncode == 0
    assert Success.objects.filter(name="reap-before-stop").exists()


@pytest.fixture
def pulls_cluster(
    transactional_db: None, site: Any, tmp_path: Path, store: Store
) -> Iterator[subprocess.Popen[bytes]]:
    """The pulls' own cluster, as `serve` runs it beside the main one (Q_CLUSTER_NAME)."""
    get_broker(f"{Conf.PREFIX}-pulls").purge_queue()
    env = env_for_subprocess(
        MSHIP_Q_NAME=Conf.PREFIX,
        Q_CLUSTER_NAME=f"{Conf.PREFIX}-pulls",
        MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR),
        MSHIP_MODEL_DIRS=",".join(site.MSHIP_MODEL_DIRS),
        MSHIP_MODEL_STORE_MIN_FREE_GIB="0",
        MSHIP_MODEL_PULLS="3",
        HF_ENDPOINT=store.host.url,
    )
    yield from qcluster(env, tmp_path / "pulls.log")


def test_it_pulls_in_a_cluster_of_its_own_while_the_main_one_starts_engines(
    api: APIClient,
    cluster: subprocess.Popen[bytes],
    pulls_cluster: subprocess.Popen[bytes],
    store: Store,
    site: Any,
) -> None:
    site.MSHIP_MODEL_PULLS = 3
    # As many slow pulls as the main cluster has workers: none of them holds one.
    store.host.faults.slow_bytes_per_s = 1_000_000
    pks = []
    for n in range(3):
        store.repo(f"acme/big{n}-GGUF", {"big.gguf": os.urandom(16 << 20)})
        answer = api.post("/api/stored-models/", {"source": f"hf:acme/big{n}-GGUF"}, format="json")
        assert answer.status_code == 202, answer.content
        pks.append(answer.json()["id"])
    wait_until(lambda: all(StoredModel.objects.get(pk=pk).bytes_done > 0 for pk in pks), 60)
    deployment = Deployment.objects.create(
        name="meanwhile", model="m", loader="simulated", memory_gib=1, config={}
    )
    assert api.post(f"/api/deployments/{deployment.pk}/start/").status_code == 202
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == State.READY, 30)
    pulling = StoredModel.objects.filter(pk__in=pks, state=PullState.PULLING).count()
    assert pulling == 3  # the start did not wait behind them
    # Deleted, each stops at its next chunk (not after its 16 MB).
    for pk in pks:
        assert api.delete(f"/api/stored-models/{pk}/").status_code == 204
    wait_until(lambda: not list((store.root / ".pulls").glob("*")), 10)
    assert api.post(f"/api/deployments/{deployment.pk}/stop/").status_code == 202
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state == State.STOPPED, 60)
