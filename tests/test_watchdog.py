"""The watchdog notices an engine that died while it served."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django_q.brokers import get_broker
from django_q.models import Schedule

from deployments import deployer
from deployments.models import DeploymentEvent, State
from deployments.watchdog import check_once
from tests.conftest import chat, pid_alive, wait_until

pytestmark = pytest.mark.usefixtures("engines")


def crashed(make_deployment: Any, **fields: Any) -> Any:
    deployment = make_deployment(config={"crash_after_requests": 1}, **fields)
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    pid = deployment.runtime_handle["replicas"][0]["pid"]
    chat(deployment.engine_url)
    wait_until(lambda: not pid_alive(pid), 10)
    return deployment


def test_it_marks_a_dead_engine_failed_with_its_exit_and_log(
    make_deployment: Any, site: Any
) -> None:
    site.MSHIP_CRASH_RESTART_MIN_UPTIME_S = 3600
    deployment = crashed(make_deployment)
    assert check_once() == [deployment.name]
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert deployment.state_reason.startswith("the engine exited with code 3 while it served")
    assert "simulated engine: serving" in deployment.state_reason
    assert deployment.engine_urls == []
    # It died right after it became ready: a crash loop is left to an operator.
    assert DeploymentEvent.objects.filter(deployment=deployment, kind="crash_loop").exists()
    assert check_once() == []


def test_it_queues_a_restart_of_an_always_on_engine_that_had_served(
    make_deployment: Any, site: Any
) -> None:
    site.MSHIP_CRASH_RESTART_MIN_UPTIME_S = 0
    get_broker().purge_queue()
    deployment = crashed(make_deployment)
    check_once()
    assert DeploymentEvent.objects.filter(deployment=deployment, kind="restart_after_crash")
    assert get_broker().queue_size() == 1


def test_it_leaves_an_on_demand_engine_failed(make_deployment: Any, site: Any) -> None:
    site.MSHIP_CRASH_RESTART_MIN_UPTIME_S = 0
    get_broker().purge_queue()
    crashed(make_deployment, mode="on_demand")
    check_once()
    assert get_broker().queue_size() == 0


def test_it_registers_its_schedule_once(transactional_db: None) -> None:
    call_command("setup_schedules")
    call_command("setup_schedules")
    schedule = Schedule.objects.get(name="modelship-watchdog")
    assert (schedule.func, schedule.schedule_type, schedule.minutes) == (
        "deployments.watchdog.check_once",
        Schedule.MINUTES,
        1,
    )
    assert Schedule.objects.get(name="modelship-ondemand-reaper").func == "ondemand.tasks.reap"
    sweep = Schedule.objects.get(name="modelship-responses-sweep")
    assert (sweep.func, sweep.minutes) == ("openai_api.tasks.sweep_responses", 60)
    sync = Schedule.objects.get(name="modelship-litellm-sync")
    assert (sync.func, sync.minutes) == ("ondemand.tasks.sync_litellm", 1)
    usage = Schedule.objects.get(name="modelship-usage-sweep")
    assert (usage.func, usage.minutes) == ("openai_api.tasks.sweep_usage", 60)
    store = Schedule.objects.get(name="modelship-store-sweep")
    assert (store.func, store.minutes) == ("deployments.store.pulls.sweep", 1)
    assert Schedule.objects.count() == 6
