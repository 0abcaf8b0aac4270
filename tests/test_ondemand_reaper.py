"""The reaper in a process of its own against the lease a gateway holds."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from common.db_calls import off_loop as off_the_loop
from deployments import deployer, engine_secrets
from deployments.models import AuditEntry, Deployment, DeploymentEvent, State
from ondemand.adapter import DjangoDeployer, in_engine_thread
from ondemand.controller import Controller
from ondemand.lease import extend
from ondemand.reaper import reap_once
from tests.conftest import (
    REPO,
    HeldSleep,
    as_gateway,
    env_for_subprocess,
    in_thread,
    reap,
    scaled,
)
from tests.fake_clock import FakeClock

pytestmark = pytest.mark.usefixtures("engines")


def test_it_waits_for_the_lease_then_puts_an_idle_model_to_sleep(
    make_deployment: Any, site: Any
) -> None:
    lazy = make_deployment("lazy", mode="on_demand", idle_timeout_s=60)
    deployer.restart(lazy.pk)
    lazy.refresh_from_db()
    # Becoming ready restarted the idle timer: a full timeout of lease.
    assert lazy.lease_until is not None
    assert lazy.lease_until > timezone.now() + timedelta(seconds=55)
    assert reap(site) == "stopped: -"
    Deployment.objects.filter(pk=lazy.pk).update(lease_until=timezone.now())
    assert reap(site) == "stopped: lazy"
    lazy.refresh_from_db()
    assert lazy.state == State.STOPPED
    event = DeploymentEvent.objects.filter(deployment=lazy, kind="stopped").get()
    assert (event.text, event.actor) == ("Put to sleep after 1 min idle", "ondemand")
    entry = AuditEntry.objects.get(action="ondemand_sleep")
    assert (entry.actor, entry.user, entry.text) == (
        "ondemand",
        None,
        "Put to sleep after 1 min idle",
    )


def test_it_puts_an_idle_model_whose_engine_sleeps_to_sleep_and_wakes_it_for_a_request(
    make_deployment: Any, site: Any
) -> None:
    sleepy = make_deployment(
        "sleepy", mode="on_demand", idle_timeout_s=60, config={"enable_sleep_mode": True}
    )
    deployer.restart(sleepy.pk)
    Deployment.objects.filter(pk=sleepy.pk).update(lease_until=timezone.now())
    assert reap(site) == "stopped: sleepy (asleep)"
    sleepy.refresh_from_db()
    assert sleepy.state == State.ASLEEP and sleepy.state_reason == "Put to sleep after 1 min idle"
    assert httpx.get(sleepy.engine_url + "/is_sleeping").json() == {"is_sleeping": True}
    asyncio.run(DjangoDeployer().wake(sleepy.pk))
    assert Deployment.objects.get(pk=sleepy.pk).state == State.READY


def test_it_stops_an_engine_asleep_past_the_longest_sleep(make_deployment: Any, site: Any) -> None:
    sleepy = make_deployment(
        "sleepy", mode="on_demand", idle_timeout_s=60, config={"enable_sleep_mode": True}
    )
    deployer.restart(sleepy.pk)
    assert deployer.sleep(sleepy.pk)
    assert reap(site) == "stopped: -"  # asleep for a moment of its hour (MSHIP_SLEEP_MAX_S)
    an_hour_ago = timezone.now() - timedelta(seconds=3601)
    Deployment.objects.filter(pk=sleepy.pk).update(state_changed_at=an_hour_ago)
    assert reap(site) == "stopped: sleepy"
    sleepy.refresh_from_db()
    assert (sleepy.state, sleepy.state_reason) == (State.STOPPED, "Stopped after 1 h asleep")
    assert AuditEntry.objects.filter(action="ondemand_stop", deployment=sleepy).exists()


def test_it_puts_away_an_idle_deployment_that_scales_to_zero(make_deployment: Any) -> None:
    """min_replicas 0 with no mode set is on demand: started by requests, so stopped idle."""
    zero = make_deployment(
        "zero", idle_timeout_s=60, autoscaling_config={"min_replicas": 0, "max_replicas": 2}
    )
    assert zero.mode is None
    deployer.restart(zero.pk)
    Deployment.objects.filter(pk=zero.pk).update(lease_until=timezone.now())
    assert reap_once() == ["zero"]
    assert Deployment.objects.get(pk=zero.pk).state == State.STOPPED


def test_it_leaves_a_model_whose_engine_is_busy_or_that_is_always_on(
    make_deployment: Any, site: Any
) -> None:
    busy = make_deployment("busy", mode="on_demand", config={"tokens_per_second": 10})
    pinned = make_deployment("pinned")
    for deployment in (busy, pinned):
        deployer.restart(deployment.pk)
    Deployment.objects.update(lease_until=timezone.now())
    busy.refresh_from_db()
    body = {
        "model": "busy",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "max_tokens": 100,
    }
    url = busy.engine_url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, auth=as_gateway) as answer:
        lines = answer.iter_lines()
        next(lines)
        assert reap(site) == "stopped: -"
    assert Deployment.objects.get(pk=busy.pk).state == State.READY
    assert Deployment.objects.get(pk=pinned.pk).state == State.READY


def test_it_refuses_a_lease_once_a_stop_was_approved(make_deployment: Any) -> None:
    lazy = make_deployment("lazy", mode="on_demand")
    deployer.restart(lazy.pk)
    assert extend(lazy.pk, 60) is not None
    deployer.stop(lazy.pk)
    assert extend(lazy.pk, 60) is None


def test_it_never_stops_an_engine_while_a_gateway_holds_its_lease(
    make_deployment: Any, site: Any
) -> None:
    """Stress, across processes: a gateway loop takes short leases and uses the engine while
    each is held; a reaper process reaps as fast as it can. No request inside a lease fails,
    and the reaper does get its stops in between."""
    lazy = make_deployment("stress", mode="on_demand", idle_timeout_s=60)
    deployer.restart(lazy.pk)
    env = env_for_subprocess(MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR))
    # The reaper reaps until told to stop (the file `done`); the loop below runs until the
    # reaper got its stops in (a deadline, not a duration: a busy machine takes longer).
    done = site.MSHIP_RUN_DIR.parent / "reaper-done"
    script = (
        "import django, os, sys; django.setup()\n"
        "from ondemand.reaper import reap_once\n"
        "stops = 0\n"
        "print('reaping', flush=True)\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    stops += len(reap_once())\n"
        "print(stops)\n"
    )
    reaper = subprocess.Popen(
        [sys.executable, "-c", script, str(done)],
        cwd=REPO,
        env={**env, "DJANGO_SETTINGS_MODULE": "modelship_site.settings"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reaper.stdout is not None and reaper.stdout.readline() == "reaping\n"
    grants, failures, restarts, checked = 0, [], 0, 0
    end = time.monotonic() + scaled(60)
    with httpx.Client(timeout=5) as client:
        while (grants < 4 or restarts < 2) and time.monotonic() < end:
            taken = time.monotonic()
            until = extend(lazy.pk, 0.5)
            if until is None:
                # Stopped between two leases: start it again, as a request would.
                worker = in_thread(deployer.restart, lazy.pk)
                worker.join()
                restarts += 1
                continue
            grants += 1
            row = Deployment.objects.get(pk=lazy.pk)
            url, auth = row.engine_url, engine_secrets.auth(row)
            # The engine idles inside the lease (its gauges say so), then serves again
            # before the lease ends: only the lease keeps the reaper away meanwhile.
            for pause in (0.0, 0.25):
                time.sleep(pause)
                if time.monotonic() - taken > 0.4:
                    break  # too close to the end of the lease to prove anything
                try:
                    said = {"model": "stress", "prompt": "x"}
                    client.post(url + "/v1/completions", json=said, auth=auth)
                    checked += 1
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
            time.sleep(0.4)  # let the lease lapse so the reaper gets its chance
    done.touch()
    stops = int(reaper.communicate(timeout=scaled(60))[0].strip())
    assert failures == []
    assert grants > 3 and checked > grants and stops > 0 and restarts > 0


def test_it_puts_an_engine_with_no_load_gauges_to_sleep_by_its_lease_alone(
    make_deployment: Any, site: Any
) -> None:
    """espeak (the TTS engine) reports no load: the gateways' lease is the whole signal."""
    voice = make_deployment(
        "voice", loader="tts", usecase="tts", model="espeak-ng", config={}, mode="on_demand"
    )
    deployer.restart(voice.pk)
    assert Deployment.objects.get(pk=voice.pk).state == State.READY
    assert extend(voice.pk, 60) is not None  # a gateway holds a slot, or just released one
    assert reap(site) == "stopped: -"
    Deployment.objects.filter(pk=voice.pk).update(lease_until=timezone.now())
    assert reap(site) == "stopped: voice"
    assert Deployment.objects.get(pk=voice.pk).state == State.STOPPED


def test_it_audits_a_wake_for_a_request_as_it_audits_a_start(make_deployment: Any) -> None:
    sleepy = make_deployment("sleepy", mode="on_demand", config={"enable_sleep_mode": True})
    deployer.restart(sleepy.pk)
    assert deployer.sleep(sleepy.pk)
    asyncio.run(DjangoDeployer().wake(sleepy.pk))
    assert Deployment.objects.get(pk=sleepy.pk).state == State.READY
    woken = AuditEntry.objects.get(action="ondemand_start")
    assert (woken.actor, woken.text) == ("ondemand", "woken for a request: ready")


def test_it_audits_a_start_for_a_request_only_where_it_started_the_model(
    make_deployment: Any,
) -> None:
    lazy = make_deployment("lazy", mode="on_demand")
    adapter = DjangoDeployer()
    asyncio.run(adapter.restart(lazy.pk))
    asyncio.run(adapter.restart(lazy.pk))  # already running: nothing started
    asyncio.run(adapter.wake(lazy.pk))  # not asleep: nothing woken
    assert Deployment.objects.get(pk=lazy.pk).state == State.READY
    audited = AuditEntry.objects.filter(action="ondemand_start")
    assert list(audited.values_list("text", flat=True)) == ["started for a request: ready"]


def test_it_keeps_starts_off_the_threads_the_gateways_reads_use(make_deployment: Any) -> None:
    """A cold start holds a thread for as long as the engine takes to come up; the reads
    of the gateway (the route table, the response store, the lease) must not queue behind
    it, even where their pool has a single thread."""
    slow = make_deployment("slow", mode="on_demand", config={"startup_delay_s": 2})
    adapter = DjangoDeployer()

    async def read_during_a_start() -> str | None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        start = asyncio.ensure_future(adapter.restart(slow.pk))
        await asyncio.sleep(0)  # the start takes its thread first
        seen = await adapter.view(slow.pk)
        await start
        return None if seen is None else seen.state

    assert asyncio.run(read_during_a_start()) in (State.PLANNED, State.STARTING)
    assert Deployment.objects.get(pk=slow.pk).state == State.READY


def test_it_writes_the_lease_the_reaper_reads_when_a_long_stream_ends(
    make_deployment: Any, site: Any
) -> None:
    """The controller on the fake clock, the deployer, the row and the reaper for real: a
    stream of 80 s (no renewal pass ran) ends, and its end restarts the idle timer on the
    row that the reaper in another process reads."""
    lazy = make_deployment("long", mode="on_demand", idle_timeout_s=60)
    deployer.restart(lazy.pk)

    def lease() -> Any:
        return Deployment.objects.get(pk=lazy.pk).lease_until

    async def stream_then_end() -> tuple[Any, Any]:
        clock = FakeClock()
        controller = Controller(DjangoDeployer(), clock)
        slot = await controller.acquire(lazy.pk)
        granted = await sync_to_async(lease)()
        await clock.advance(80)
        controller.release(slot)
        await asyncio.gather(*list(controller._background))  # the release's lease write
        return granted, await sync_to_async(lease)()

    granted, released = asyncio.run(stream_then_end())
    assert released > granted  # written again at the last byte, not only at the grant
    assert released > timezone.now() + timedelta(seconds=60)  # a full idle timeout from now
    assert reap(site) == "stopped: -"


@pytest.mark.parametrize("ignore_sleep", [False, True], ids=["sleeps", "stays_awake"])
def test_it_gives_no_slot_on_an_engine_going_to_sleep_and_the_request_wakes_it(
    make_deployment: Any, held_sleep: HeldSleep, ignore_sleep: bool
) -> None:
    """The engine's /sleep takes its time (up to a minute on vLLM); a request that comes
    meanwhile waits instead of getting a slot on an engine about to sleep, and starts it
    again once it sleeps (or, where it took the /sleep and stayed awake, was stopped)."""
    sleepy = make_deployment(
        "sleepy", mode="on_demand", config={"enable_sleep_mode": True, "ignore_sleep": ignore_sleep}
    )
    deployer.restart(sleepy.pk)

    async def race() -> tuple[bool, bool, str]:
        clock = FakeClock()
        controller = Controller(DjangoDeployer(), clock)
        waits = asyncio.Event()
        clock_wait = clock.wait

        async def wait(event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
            waits.set()
            return await clock_wait(event, timeout)

        clock.wait = wait  # type: ignore[method-assign]
        sleeping = asyncio.ensure_future(in_engine_thread(deployer.sleep, sleepy.pk))
        await asyncio.to_thread(held_sleep.began.wait)
        request = asyncio.ensure_future(controller.acquire(sleepy.pk))
        first = asyncio.ensure_future(waits.wait())
        await asyncio.wait({request, first}, return_when=asyncio.FIRST_COMPLETED)
        granted_during_sleep = request.done()
        held_sleep.release.set()
        put_away = await sleeping
        state = await off_the_loop(lambda: Deployment.objects.get(pk=sleepy.pk).state)
        controller.notify()  # the route table's listener does this in the gateway
        slot = await request
        controller.release(slot)
        return granted_during_sleep, put_away, state

    granted_during_sleep, put_away, state_after_sleep = asyncio.run(race())
    assert not granted_during_sleep
    assert put_away and state_after_sleep == (State.STOPPED if ignore_sleep else State.ASLEEP)
    woken = Deployment.objects.get(pk=sleepy.pk)
    assert woken.state == State.READY
    assert httpx.get(woken.engine_url + "/is_sleeping").json() == {"is_sleeping": False}
