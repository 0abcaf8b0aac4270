"""Starting and stopping engines as real processes: health, failures, grace, the gate."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from deployments import deployer, display, tasks
from deployments.models import Deployment, DeploymentEvent, State
from deployments.refusals import CannotSleep
from deployments.runtimes.process import ProcessRuntime
from openai_api.usage.held import account_periods
from tests.conftest import (
    HeldSleep,
    answers,
    chat,
    in_thread,
    pid_alive,
    reply_of,
    scaled,
    sim,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("engines")


def test_it_starts_an_engine_that_answers_and_stops_it(make_deployment: Any) -> None:
    deployment = make_deployment(config=sim(reply="hello from the engine"))
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY
    assert reply_of(deployment.engine_url) == "hello from the engine"
    pid = deployment.runtime_handle["replicas"][0]["pid"]

    assert deployer.stop(deployment.pk, reason="test")
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED
    assert deployment.engine_urls == []
    assert not pid_alive(pid)
    kinds = list(
        DeploymentEvent.objects.filter(deployment=deployment)
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds == ["starting", "ready", "stopping", "stopped"]


def test_it_runs_every_replica_on_its_own_port(make_deployment: Any) -> None:
    deployment = make_deployment(num_replicas=3, memory_gib=1)
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY
    assert len(set(deployment.engine_urls)) == 3
    pids = {
        chat(url)["id"] and httpx.get(url + "/sim/stats").json()["pid"]
        for url in deployment.engine_urls
    }
    assert len(pids) == 3


def test_it_fails_a_crashing_engine_with_its_log_tail(make_deployment: Any) -> None:
    deployment = make_deployment(config=sim(fail_at_start=True))
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "exited with code 1 during start-up" in deployment.state_reason
    assert "RuntimeError: injected start failure" in deployment.state_reason
    assert deployment.engine_urls == []


def test_it_names_the_exit_code_of_an_engine_its_reaper_has_not_reaped_yet(
    make_deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start sees the engine dead (a zombie, or gone from /proc) before the reaper thread
    stored its code: it waits for the code instead of saying only that the engine is gone."""
    reaper_may_go = threading.Event()
    reap = ProcessRuntime._reap

    def late_reaper(proc: subprocess.Popen[bytes]) -> None:
        reaper_may_go.wait(120)
        reap(proc)

    monkeypatch.setattr(ProcessRuntime, "_reap", staticmethod(late_reaper))
    deployment = make_deployment(config=sim(fail_at_start=True))
    try:
        deployer.restart(deployment.pk)
    finally:
        reaper_may_go.set()
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "the engine exited with code 1 during start-up" in deployment.state_reason


def test_it_fails_an_engine_that_never_gets_healthy_and_kills_it(
    make_deployment: Any, site: Any
) -> None:
    deployment = make_deployment(config=sim(startup_delay_s=30))
    deployer.restart(deployment.pk, timeout_s=1.5)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "not healthy after 1.5 s" in deployment.state_reason
    assert "simulated engine: loading" in deployment.state_reason
    event = DeploymentEvent.objects.filter(deployment=deployment, kind="starting").get()
    assert event  # the start was recorded before it failed
    # The engine process is gone: nothing listens and no pid of it is left.
    handles_pids = [int(line.split()[0]) for line in _ps_lines() if '"startup_delay_s": 30' in line]
    assert handles_pids == []


def _ps_lines() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if " Z" not in line and "ps -eo" not in line]


def test_it_kills_an_engine_that_ignores_sigterm_after_the_grace_period(
    make_deployment: Any, site: Any
) -> None:
    site.MSHIP_STOP_GRACE_S = 1.0
    deployment = make_deployment(config=sim(ignore_sigterm=True))
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    pid = deployment.runtime_handle["replicas"][0]["pid"]
    assert deployer.stop(deployment.pk)
    assert not pid_alive(pid)
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED


def test_it_starts_an_engine_once_for_twenty_concurrent_starts(make_deployment: Any) -> None:
    deployment = make_deployment(config=sim(startup_delay_s=0.5))
    barrier = threading.Barrier(20)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            barrier.wait()
            deployer.restart(deployment.pk)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    deployment.refresh_from_db()
    assert deployment.state == State.READY
    assert DeploymentEvent.objects.filter(deployment=deployment, kind="starting").count() == 1
    assert len(deployment.runtime_handle["replicas"]) == 1


def test_it_puts_an_engine_to_sleep_and_wakes_it(make_deployment: Any) -> None:
    deployment = make_deployment(config=sim(enable_sleep_mode=True))
    deployer.restart(deployment.pk)
    assert deployer.sleep(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.ASLEEP
    assert httpx.get(deployment.engine_url + "/is_sleeping").json() == {"is_sleeping": True}
    with pytest.raises(httpx.HTTPStatusError):
        chat(deployment.engine_url)
    asleep_since = timezone.now()
    deployer.wake(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY
    assert reply_of(deployment.engine_url)
    # The wake is held and a load from its start (openai_api/usage/held.py): its event is
    # dated when the wake began, before the ready it led to.
    held, loads = account_periods(deployment.name, asleep_since, timezone.now())
    ((woke, ready),) = loads
    assert held[0][0] == woke and asleep_since <= woke < ready


def test_it_sleeps_at_level_one_while_host_memory_holds_the_weights_else_at_level_two(
    make_deployment: Any, settings: Any
) -> None:
    settings.MSHIP_SLEEP_HOST_GIB = 1.5  # one 1 GiB engine's weights, not two
    kept, dropped = (
        make_deployment(name, config=sim(enable_sleep_mode=True)) for name in ("kept", "dropped")
    )
    for deployment in (kept, dropped):
        deployer.restart(deployment.pk)
        assert deployer.sleep(deployment.pk)
        deployment.refresh_from_db()
    assert (kept.sleep_level, dropped.sleep_level) == (1, 2)
    assert httpx.get(dropped.engine_url + "/sim/stats").json()["sleep_level"] == 2
    assert display.label_of(kept, None) == "asleep · weights in host memory"
    assert display.label_of(dropped, None) == "asleep · weights dropped"
    # Woken, the level-2 engine has its weights reloaded (the simulated engine answers 500
    # until /collective_rpc reload_weights), and the tier is gone with the sleep.
    for deployment in (kept, dropped):
        deployer.wake(deployment.pk)
        deployment.refresh_from_db()
        assert (deployment.state, deployment.sleep_level) == (State.READY, None)
        assert reply_of(deployment.engine_url)


def test_it_never_lets_two_sleeps_at_once_both_take_the_last_of_the_host_budget(
    make_deployment: Any, settings: Any
) -> None:
    settings.MSHIP_SLEEP_HOST_GIB = 1.5  # one 1 GiB engine's weights, not two
    pair = [make_deployment(name, config=sim(enable_sleep_mode=True)) for name in ("a", "b")]
    for deployment in pair:
        deployer.restart(deployment.pk)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def sleep(pk: int) -> None:
        try:
            barrier.wait()
            assert deployer.sleep(pk)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sleep, args=(d.pk,)) for d in pair]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = Deployment.objects.filter(pk__in=[d.pk for d in pair])
    levels = sorted(level or 0 for level in rows.values_list("sleep_level", flat=True))
    assert levels == [1, 2]  # each level chosen with the other's claim counted


def test_it_refuses_to_sleep_an_engine_without_sleep_mode(make_deployment: Any) -> None:
    deployment = make_deployment(loader="llama_server", model="/nonexistent.gguf", memory_gib=1)
    with pytest.raises(CannotSleep):
        deployer.sleep(deployment.pk)
    with pytest.raises(CannotSleep):
        deployer.sleep(make_deployment("awake").pk)  # a vLLM without enable_sleep_mode


def test_it_stops_an_engine_that_takes_a_sleep_and_stays_awake(make_deployment: Any) -> None:
    """vLLM's CPU worker answers /sleep and goes on holding its memory; a request "woken"
    into it would hang. Such an engine is stopped instead, and the deployment says why."""
    deployment = make_deployment(config=sim(enable_sleep_mode=True, ignore_sleep=True))
    deployer.restart(deployment.pk)
    url = deployment.engine_url
    assert deployer.sleep(deployment.pk, reason="Put to sleep after 1 min idle")
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED
    assert deployment.state_reason == (
        "sleep not supported by this engine here (it took /sleep and stayed awake):"
        " stopping instead"
    )
    assert not answers(url)
    ignored = DeploymentEvent.objects.get(deployment=deployment, kind="sleep_ignored")
    assert "stayed awake" in ignored.text


def test_it_stops_the_engine_of_a_deployment_deleted_while_it_goes_to_sleep(
    make_deployment: Any, held_sleep: HeldSleep
) -> None:
    """A delete that comes while the engine takes its /sleep (up to a minute on vLLM) finds
    the row stopping: the engine goes with the row, not left asleep with nothing to track it."""
    deployment = make_deployment(config=sim(enable_sleep_mode=True))
    deployer.restart(deployment.pk)
    url = Deployment.objects.get(pk=deployment.pk).engine_url
    sleeping = in_thread(deployer.sleep, deployment.pk)
    assert held_sleep.began.wait(scaled(30))
    assert tasks.remove(deployment.pk)
    held_sleep.release.set()
    sleeping.join()
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert not answers(url + "/is_sleeping")


def test_it_rests_an_idle_engine_by_sleep_where_it_sleeps_else_by_stop(
    make_deployment: Any,
) -> None:
    sleeper = make_deployment("sleeper", config=sim(enable_sleep_mode=True))
    plain = make_deployment("plain")
    for deployment in (sleeper, plain):
        deployer.restart(deployment.pk)
        assert deployer.rest(deployment.pk, reason="idle")
    assert Deployment.objects.get(pk=sleeper.pk).state == State.ASLEEP
    assert Deployment.objects.get(pk=plain.pk).state == State.STOPPED
    assert not deployer.rest(sleeper.pk)  # asleep already: nothing to do


def test_it_fails_a_start_whose_binary_does_not_exist(make_deployment: Any) -> None:
    deployment = make_deployment(command=["/nonexistent/engine", "--port", "{port}"])
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "cannot run '/nonexistent/engine'" in deployment.state_reason


def test_it_stops_only_when_the_precheck_approves_on_the_fresh_row(make_deployment: Any) -> None:
    deployment = make_deployment()
    deployer.restart(deployment.pk)
    seen: list[str] = []

    def refuse(row: Any) -> bool:
        seen.append(row.state)
        return False

    assert not deployer.stop(deployment.pk, precheck=refuse)
    deployment.refresh_from_db()
    assert deployment.state == State.READY
    assert reply_of(deployment.engine_url)

    assert deployer.stop(deployment.pk, precheck=lambda row: row.state == State.READY)
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED
    assert seen == ["ready"]
    # A second stop finds nothing to do and does not ask the precheck.
    assert not deployer.stop(deployment.pk, precheck=refuse)
    assert seen == ["ready"]


def test_it_stops_a_deployment_while_it_starts(make_deployment: Any) -> None:
    deployment = make_deployment(config=sim(startup_delay_s=2))
    starter = in_thread(deployer.restart, deployment.pk)
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).engine_urls != [], 10)
    pid = Deployment.objects.get(pk=deployment.pk).runtime_handle["replicas"][0]["pid"]
    assert deployer.stop(deployment.pk, reason="changed my mind")
    starter.join()
    deployment.refresh_from_db()
    assert deployment.state == State.STOPPED
    assert deployment.state_reason == "changed my mind"
    assert not pid_alive(pid)


def test_it_runs_a_process_engine_without_modelships_secrets_in_a_folder_of_its_own(
    make_deployment: Any, monkeypatch: Any, settings: Any
) -> None:

    monkeypatch.setenv("MSHIP_SECRET_KEY", "not-for-engines")
    monkeypatch.setenv("REDIS_URL", "redis://secret@127.0.0.1:6379/0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what model libraries read passes through
    deployment = make_deployment("sim")
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    pid = deployment.runtime_handle["replicas"][0]["pid"]
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().partition("=")[::2] for item in raw if item)
    assert "MSHIP_SECRET_KEY" not in env and "REDIS_URL" not in env
    assert "DATABASE_URL" not in env
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == str(settings.MSHIP_HF_HOME)  # the model cache engines share
    # Modelship's virtualenv leads PATH: an engine installed there (vllm) is found.
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    cwd = Path(f"/proc/{pid}/cwd").resolve()
    assert cwd != Path(settings.BASE_DIR)
    assert cwd.is_relative_to(Path(settings.MSHIP_RUN_DIR))
    assert reply_of(deployment.engine_url)
