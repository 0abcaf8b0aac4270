"""Several gateway processes serving one site: the in-process gateway of the tests and another
gateway process on its own port (as a second worker, or a second host behind a load
balancer), on the same database. What one process does, the other sees: a background run
cancelled or resumed through either, a key's rate limit (in Redis), one on-demand start for
a burst through both; and `serve --workers 2` sharing one port."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.conf import settings

from deployments import deployer, operations
from deployments.models import Deployment, DeploymentEvent, State
from deployments.runtimes.process import free_port
from openai_api.rate_limits import rate_limiter
from tests.conftest import REPO, answers, env_for_subprocess, wait_until
from tests.gateway_support import REDIS, seen_by_gateway, start_gateway

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.redis]
HI: list[Any] = [{"role": "user", "content": "hi"}]


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def known_to(url: str, key: str) -> str:
    """`key`, once the gateway at `url` knows it: a key made here reaches another process
    with that one's next refresh (a 401 until then)."""
    headers = {"authorization": f"Bearer {key}"}
    wait_until(lambda: httpx.get(url + "/v1/models", headers=headers).status_code != 401, 10)
    return key


def lists(url: str, key: str, name: str) -> bool:
    return name in {m.id for m in sdk(url, key).models.list()}


def burst(urls: list[str], key: str, model: str) -> list[str]:
    """One chat request to each of `urls` at once; the answers' texts."""
    results: list[str] = []

    def ask(url: str) -> None:
        answer = sdk(url, key).chat.completions.create(model=model, messages=HI)
        results.append(str(answer.choices[0].message.content))

    threads = [threading.Thread(target=ask, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def sim_stats(deployment: Deployment, what: str) -> Any:
    deployment.refresh_from_db()
    return httpx.get(deployment.engine_urls[0] + what).json()


def test_it_shows_a_route_change_in_every_process_within_the_refresh(
    other: str,
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
) -> None:
    sim = serving("sim")
    key = known_to(other, api_key())
    Deployment.objects.filter(pk=sim.pk).update(aliases=["renamed"], version=sim.version + 1)

    # MSHIP_ROUTE_REFRESH_S is 0.05 s in both: well within a second.
    wait_until(lambda: lists(gateway_url, key, "renamed") and lists(other, key, "renamed"), 5)


def test_it_stops_a_background_run_cancelled_through_another_process(
    other: str,
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
) -> None:
    """The run lives here; the cancel arrives there. The run's heartbeat reads the cancel
    back and closes the engine request."""
    sim = serving("sim", config={"reply": "slow " * 50, "tokens_per_second": 5})
    key = known_to(other, api_key())
    queued = sdk(gateway_url, key).responses.create(model="sim", input="x", background=True)
    wait_until(lambda: sim_stats(sim, "/sim/stats")["running"] == 1, 10)
    assert sdk(other, key).responses.cancel(queued.id).status == "cancelled"
    wait_until(lambda: sim_stats(sim, "/sim/cancellations")["count"] == 1, 10)
    assert sdk(gateway_url, key).responses.retrieve(queued.id).status == "cancelled"


@pytest.mark.skipif(
    "redis" not in str(settings.CHANNEL_LAYERS["default"]["BACKEND"]).lower(),
    reason="the notice goes over a Redis channel layer (REDIS_URL)",
)
def test_it_stops_a_run_in_another_process_at_once_when_cancelled_here(
    tmp_path: Path,
    site: Any,
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
) -> None:
    """The run lives there, with a heartbeat too slow to matter: the cancel's notice on the
    channel layer is what stops it."""
    sim = serving("sim", config={"reply": "slow " * 50, "tokens_per_second": 5})
    key = api_key()
    port = free_port("127.0.0.1")
    there = start_gateway(tmp_path, port, MSHIP_RESPONSES_HEARTBEAT_S="60")
    try:
        url = f"http://127.0.0.1:{port}"
        queued = sdk(url, key).responses.create(model="sim", input="x", background=True)
        wait_until(lambda: sim_stats(sim, "/sim/stats")["running"] == 1, 10)
        assert sdk(gateway_url, key).responses.cancel(queued.id).status == "cancelled"
        wait_until(lambda: sim_stats(sim, "/sim/cancellations")["count"] == 1, 10)
    finally:
        there.terminate()
        there.wait(30)


def test_it_resumes_a_background_stream_through_another_process(
    other: str,
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    site: Any,
) -> None:
    site.REDIS_URL = REDIS  # the replay log both processes read
    serving("sim", config={"reply": "a b c d e f g h", "tokens_per_second": 40})
    key = known_to(other, api_key())
    first: list[Any] = []
    stream = sdk(gateway_url, key).responses.create(
        model="sim", input="x", background=True, stream=True
    )
    for event in stream:
        first.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()
    cursor = first[-1].sequence_number
    rest = list(
        sdk(other, key).responses.retrieve(first[0].response.id, stream=True, starting_after=cursor)
    )
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "a b c d e f g h"
    )


def test_it_holds_a_keys_rate_limit_across_processes(
    other: str,
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    site: Any,
) -> None:
    site.REDIS_URL = REDIS
    serving("sim")
    key = known_to(other, api_key(requests_per_minute=5))  # the probe that saw it counts
    answers_ = []
    for url in [gateway_url, other] * 4:
        with httpx.Client(base_url=url + "/v1") as client:
            answer = client.post(
                "/chat/completions",
                json={"model": "sim", "messages": HI},
                headers={"authorization": f"Bearer {key}"},
            )
        answers_.append(answer.status_code)
    # Four more in all, whichever process took them; each process alone would have let 5 in.
    assert sorted(answers_) == [200] * 4 + [429] * 4
    assert answers_[:4] == [200] * 4


def test_it_starts_an_on_demand_model_once_for_a_burst_through_both_processes(
    other: str,
    gateway_url: str,
    api_key: Callable[..., str],
    make_deployment: Callable[..., Deployment],
    site: Any,
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    lazy = make_deployment(
        "lazy",
        mode="on_demand",
        idle_timeout_s=600,
        config={"reply": "up", "startup_delay_s": 1},
    )
    seen_by_gateway(lambda s: "lazy" in s.routes)
    results = burst([gateway_url, other] * 8, known_to(other, api_key()), "lazy")
    assert results == ["up"] * 16
    lazy.refresh_from_db()
    assert lazy.state == State.READY
    starts = DeploymentEvent.objects.filter(deployment=lazy, kind=State.STARTING)
    assert starts.count() == 1
    assert len(lazy.engine_urls) == 1


def test_it_forgives_a_start_failure_in_another_process_after_a_change_here(
    other: str, api_key: Callable[..., str], make_deployment: Callable[..., Deployment]
) -> None:
    """The other process backs off after a failed start; a new configuration saved here
    (the admin or /api) forgives it there too: the next request starts the model."""
    flaky = make_deployment(
        "flaky", mode="on_demand", idle_timeout_s=600, config={"fail_at_start": True}
    )
    key = known_to(other, api_key())
    client = sdk(other, key)
    wait_until(lambda: lists(other, key, "flaky"), 5)
    for _ in range(2):  # the second is refused by the backoff, without a start
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model="flaky", messages=HI)
        assert (failed.value.status_code, failed.value.code) == (503, "start_failed")
    flaky.refresh_from_db()
    flaky.config = {"reply": "fixed"}
    operations.update(flaky, None, actor="test", work=lambda *_: None)
    answer = client.chat.completions.create(model="flaky", messages=HI)
    assert answer.choices[0].message.content == "fixed"


def test_it_makes_room_once_for_a_burst_through_both_processes(
    other: str,
    gateway_url: str,
    api_key: Callable[..., str],
    make_deployment: Callable[..., Deployment],
    site: Any,
) -> None:
    """Two idle models fill the 8 GiB; a burst for a third through both processes stops one
    of them, once: make-room stops are decided under the start-up gate, each only while the
    room is still short (memory.short_of_room)."""
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    idle = [
        make_deployment(name, mode="on_demand", idle_timeout_s=1, memory_gib=4.0)
        for name in ("idle-a", "idle-b")
    ]
    for deployment in idle:
        deployer.restart(deployment.pk)
    make_deployment("new", mode="on_demand", memory_gib=4.0, config={"reply": "new"})
    seen_by_gateway(lambda s: s.routes["idle-b"].state == "ready" and "new" in s.routes)
    # Past their idle timeout, and their leases lapsed: either may be stopped for it.
    Deployment.objects.filter(pk__in=[d.pk for d in idle]).update(lease_until=None)
    time.sleep(1.5)
    results = burst([gateway_url, other] * 6, known_to(other, api_key()), "new")
    # Each is answered (those that had to queue for memory were told so first: an unused
    # model is stopped at the first look, so most do not).
    assert len(results) == 12 and all(r.endswith("new") for r in results), results
    made_room = DeploymentEvent.objects.filter(
        kind=State.STOPPED, text="Put to sleep to make room for new"
    )
    assert made_room.count() == 1
    states = sorted(Deployment.objects.values_list("state", flat=True))
    assert states == [State.READY, State.READY, State.STOPPED]


def test_it_serves_one_port_from_several_workers_and_sums_their_metrics(
    site: Any, tmp_path: Path, serving: Callable[..., Deployment], api_key: Callable[..., str]
) -> None:
    serving("sim", config={"reply": "one two three four", "tokens_per_second": 8})
    key = api_key()
    port = free_port("127.0.0.1")
    metrics = tmp_path / "metrics"
    serve = subprocess.Popen(
        [*(sys.executable, "manage.py", "serve", "--port", str(port)), "--workers", "2"],
        cwd=REPO,
        env=env_for_subprocess(
            MSHIP_VAR_DIR=str(tmp_path / "var"),
            MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR),
            MSHIP_MEMORY_CAPACITY_GIB="8",
            MSHIP_ROUTE_REFRESH_S="0.05",
            PROMETHEUS_MULTIPROC_DIR=str(metrics),
        ),
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(url + "/health"), 60)
        workers = server_pids(serve.pid)
        assert len(workers) == 2
        statuses: list[int] = []

        def ask() -> None:  # a connection each: the kernel hands each to one worker
            with httpx.Client(base_url=url + "/v1", timeout=30) as client:
                answer = client.post(
                    "/chat/completions",
                    json={"model": "sim", "messages": HI},
                    headers={"authorization": f"Bearer {key}"},
                )
                statuses.append(answer.status_code)

        threads = [threading.Thread(target=ask) for _ in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert statuses == [200] * 32
        # Each worker counted what it served, in its own file; /metrics sums them.
        assert {p for p in workers if (metrics / f"counter_{p}.db").exists()} == set(workers)
        assert requests_total(httpx.get(url + "/metrics").text, "sim") == 32
    finally:
        serve.terminate()
        serve.wait(60)
    assert (serve.returncode, server_pids(serve.pid)) == (0, [])


def server_pids(parent: int) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-P", str(parent), "-f", "modelship_site.server"],
        capture_output=True,
        text=True,
    )
    return [int(pid) for pid in found.stdout.split()]


def requests_total(text: str, model: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("modelship_requests_total{") and f'model="{model}"' in line
    )


def test_it_keeps_limiting_per_process_while_redis_fails(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    site: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    site.REDIS_URL = f"redis://127.0.0.1:{free_port('127.0.0.1')}/0"  # nothing listens
    rate_limiter.warned_at = float("-inf")  # said once a minute: say it for this test
    serving("sim")
    client = sdk(gateway_url, api_key(requests_per_minute=2))
    for _ in range(2):
        client.chat.completions.create(model="sim", messages=HI)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="sim", messages=HI)
    assert "rate limits are per process while Redis fails" in caplog.text


def test_it_leaves_the_engines_to_their_host_as_a_gateway_only_host(
    gateway_url: str,
    site: Any,
    tmp_path: Path,
    serving: Callable[..., Deployment],
    make_deployment: Callable[..., Deployment],
    api_key: Callable[..., str],
) -> None:
    sim = serving("sim", config={"reply": "from the engine host"})
    elsewhere = make_deployment("starting-elsewhere", state=State.STARTING)
    port = free_port("127.0.0.1")
    serve = subprocess.Popen(
        [*(sys.executable, "manage.py", "serve", "--port", str(port)), "--gateway-only"],
        cwd=REPO,
        env=env_for_subprocess(
            MSHIP_VAR_DIR=str(tmp_path / "var"),
            MSHIP_RUN_DIR=str(tmp_path / "other-host"),
            MSHIP_ROUTE_REFRESH_S="0.05",
        ),
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(url + "/health"), 60)
        answer = sdk(url, api_key()).chat.completions.create(model="sim", messages=HI)
        assert answer.choices[0].message.content == "from the engine host"
    finally:
        serve.terminate()
        serve.wait(60)
    printed = (tmp_path / "serve.log").read_text()
    assert serve.returncode == 0, printed
    assert "engines left running" in printed
    # Neither adopted (a start elsewhere is not "interrupted") nor stopped at its shutdown.
    assert Deployment.objects.get(pk=elsewhere.pk).state == State.STARTING
    sim.refresh_from_db()
    assert sim.state == State.READY and answers(sim.engine_urls[0] + "/health")
