"""After a Modelship restart, live engines are adopted and dead ones settled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from django.utils import timezone

from deployments import deployer
from deployments.adoption import adopt_all
from deployments.models import Deployment, State
from deployments.transitions import transition
from ondemand.reaper import reap_once
from tests.conftest import REPO, env_for_subprocess, pid_alive, reply_of, wait_until

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")


def test_it_adopts_an_engine_started_by_a_previous_modelship_process(
    tmp_path: Path, site: Any
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "name": "kept",
                        "model": "m",
                        "loader": "simulated",
                        "memory_gib": 1,
                        "simulated_config": {"reply": "still here"},
                    }
                ]
            }
        )
    )
    env = env_for_subprocess(MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR), MSHIP_MEMORY_CAPACITY_GIB="8")
    # A whole Modelship process deploys the engine, then exits: that is the restart.
    subprocess.run(
        [sys.executable, "manage.py", "deploy", "-f", str(models), "--wait"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    kept = Deployment.objects.get(name="kept")
    assert kept.state == State.READY
    pid = kept.runtime_handle["replicas"][0]["pid"]

    outcome = adopt_all()
    assert (outcome["adopted"], outcome["stopped"]) == (["kept"], [])
    kept.refresh_from_db()
    assert kept.state == State.READY
    assert kept.runtime_handle["replicas"][0]["pid"] == pid  # no restart
    assert reply_of(kept.engine_url) == "still here"
    # The adopted engine can be stopped by this process although it did not start it.
    assert deployer.stop(kept.pk)
    assert not pid_alive(pid)


def test_it_marks_a_deployment_whose_engine_died_stopped(make_deployment: Any) -> None:
    deployment = make_deployment()
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    handle = deployment.runtime_handle["replicas"][0]
    os.killpg(handle["pid"], signal.SIGKILL)
    wait_until(lambda: not pid_alive(handle["pid"]))

    outcome = adopt_all()
    assert (outcome["adopted"], outcome["stopped"]) == ([], [deployment.name])
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED
    assert deployment.state_reason == "engine gone when Modelship restarted"
    assert deployment.engine_urls == []


def test_it_settles_a_start_that_died_with_its_process(make_deployment: Any) -> None:
    deployment = make_deployment()
    transition(deployment, State.STARTING, expected=[State.PLANNED])
    adopt_all()
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED
    assert deployment.state_reason == "start interrupted by a Modelship restart"
    # And it can be started again.
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY


def test_it_restarts_the_idle_timer_of_an_adopted_on_demand_engine(make_deployment: Any) -> None:
    lazy = make_deployment("lazy", mode="on_demand", idle_timeout_s=600)
    deployer.restart(lazy.pk)
    # Modelship was down longer than the lease: without a fresh timer, the reaper's first
    # pass would stop the engine it has just adopted.
    Deployment.objects.filter(pk=lazy.pk).update(lease_until=timezone.now() - timedelta(hours=1))
    assert adopt_all()["adopted"] == ["lazy"]
    lazy.refresh_from_db()
    assert lazy.lease_until is not None
    assert lazy.lease_until > timezone.now() + timedelta(seconds=590)
    assert reap_once() == []
    assert Deployment.objects.get(pk=lazy.pk).state == State.READY
