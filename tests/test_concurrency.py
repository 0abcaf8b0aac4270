"""max_concurrency per deployment and per key (openai_api/concurrency.py): the order a freed
place goes in (class, aging, keys taking turns, arrival), the 429 of the reject setting and of
a wait past the queue timeout, and no place lost to a request that gave up."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import openai
import pytest

from ondemand import registry
from ondemand.controller import Controller
from openai_api import concurrency
from openai_api.catalog import Key, Route
from openai_api.concurrency import Limits, limits
from openai_api.dispatch import Dispatcher
from openai_api.errors import GatewayError
from tests.conftest import in_thread, wait_until
from tests.fake_clock import FakeClock
from tests.ondemand_fakes import FakeDeployer

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment


def route(cap: int | None = 1, priority: int = 0, deployment_id: int = 1) -> Route:
    return Route(
        deployment_id=deployment_id,
        name=f"model-{deployment_id}",
        aliases=(),
        loader="simulated",
        usecase="generate",
        endpoints=frozenset({"chat/completions"}),
        state="ready",
        on_demand=False,
        urls=("http://127.0.0.1:1",),
        created=0,
        priority=priority,
        max_concurrency=cap,
    )


def key(id: int, priority: int = 0, cap: int | None = None) -> Key:
    return Key(id, f"key-{id}", f"p{id}", "", False, frozenset(), None, priority, cap)


class Requests:
    """Requests that take a place and hold it until the test lets them go, in order."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.served: list[str] = []
        self.done: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def send(self, name: str, to: Route, by: Key | None) -> None:
        self.done[name] = asyncio.Event()

        async def run() -> None:
            async with self.limits.held(to, by):
                self.served.append(name)
                await self.done[name].wait()

        self.tasks[name] = asyncio.ensure_future(run())

    async def finish(self, name: str) -> None:
        self.done[name].set()
        await self.tasks[name]
        await settle()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def requests(settings: Any) -> Requests:
    settings.MSHIP_CONCURRENCY_OVERFLOW = "queue"
    settings.MSHIP_PRIORITY_AGING_S = 120
    return Requests(Limits())


async def test_it_lets_keys_take_turns_so_a_burst_does_not_go_first(requests: Requests) -> None:
    chat, burst, single = route(cap=1), key(1), key(2)
    for n in range(5):
        requests.send(f"burst-{n}", chat, burst)
    await settle()
    requests.send("single", chat, single)
    await settle()
    assert requests.served == ["burst-0"]
    await requests.finish("burst-0")
    assert requests.served == ["burst-0", "single"]  # one turn, not four
    for name in ("single", "burst-1", "burst-2", "burst-3"):
        await requests.finish(name)
    assert requests.served == ["burst-0", "single", *(f"burst-{n}" for n in range(1, 5))]
    await requests.finish("burst-4")
    assert not requests.limits.waiting and not requests.limits.by_deployment


async def test_it_gives_a_freed_place_to_the_higher_class_first(requests: Requests) -> None:
    chat = route(cap=1)
    requests.send("first", chat, key(1))
    requests.send("normal", chat, key(2))
    requests.send("high", chat, key(3, priority=10))
    await settle()
    await requests.finish("first")
    assert requests.served == ["first", "high"]
    await requests.finish("high")
    await requests.finish("normal")


async def test_it_holds_a_key_to_its_own_limit_while_others_go_by(requests: Requests) -> None:
    chat, capped, other = route(cap=None), key(1, cap=1), key(2)
    requests.send("capped-1", chat, capped)
    requests.send("capped-2", chat, capped)
    requests.send("other", chat, other)
    await settle()
    assert requests.served == ["capped-1", "other"]
    await requests.finish("capped-1")
    assert requests.served == ["capped-1", "other", "capped-2"]
    await requests.finish("capped-2")
    await requests.finish("other")


async def test_it_answers_429_with_retry_after_when_set_to_reject(
    requests: Requests, settings: Any
) -> None:
    settings.MSHIP_CONCURRENCY_OVERFLOW = "reject"
    chat, app = route(cap=1), key(1)
    requests.send("held", chat, app)
    await settle()
    with pytest.raises(GatewayError) as refused:
        async with requests.limits.held(chat, app):
            pass
    answer = refused.value
    assert (answer.status, answer.code) == (429, "too_many_concurrent_requests")
    assert answer.headers == {"retry-after": "1"} and "model-1 has 1 requests" in answer.message
    await requests.finish("held")


async def test_it_answers_429_past_the_queue_timeout_and_loses_no_place(
    requests: Requests, settings: Any
) -> None:
    settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = 0.05
    chat, app = route(cap=1), key(1, cap=1)
    requests.send("held", chat, app)
    await settle()
    with pytest.raises(GatewayError) as refused:
        async with requests.limits.held(chat, app):
            pass
    assert "This API key has 1 requests in flight" in refused.value.message
    # One that hangs up while it waits leaves nothing behind either.
    settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = 60
    requests.send("gives-up", chat, app)
    await settle()
    requests.tasks["gives-up"].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await requests.tasks["gives-up"]
    await requests.finish("held")
    assert not requests.limits.waiting and not requests.limits.by_deployment
    assert not requests.limits.by_key
    requests.send("after", chat, app)  # the place is free again
    await settle()
    assert requests.served == ["held", "after"]
    await requests.finish("after")


def waiting_in_gateway() -> int:
    return sum(len(limits.waiting) for limits in concurrency._by_loop.values())


@pytest.mark.usefixtures("engines")
def test_it_holds_requests_past_max_concurrency_and_serves_the_higher_key_first(
    serving: Callable[..., Deployment], api_key: Callable[..., str], gateway_url: str
) -> None:
    # Each answer streams for 2 s: the first holds the one place while the others queue.
    serving("sim", config={"reply": "word " * 8, "tokens_per_second": 4}, max_concurrency=1)
    keys = {"normal": api_key("normal"), "high": api_key("high", priority=10)}
    finished: list[str] = []

    def ask(who: str) -> None:
        sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=keys[who], max_retries=0)
        answer = sdk.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content
        finished.append(who)

    holder = openai.OpenAI(base_url=gateway_url + "/v1", api_key=keys["normal"], max_retries=0)
    with holder.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], stream=True
    ) as stream:
        next(iter(stream))  # it holds the one place
        waiters = [in_thread(ask, "normal")]
        wait_until(lambda: waiting_in_gateway() == 1, 10)
        waiters.append(in_thread(ask, "high"))
        wait_until(lambda: waiting_in_gateway() == 2, 10)
        assert finished == []
    for waiter in waiters:
        waiter.join(30)
    assert finished == ["high", "normal"]  # the high key's, though it came second


@pytest.mark.usefixtures("engines")
def test_it_answers_429_past_max_concurrency_when_set_to_reject(
    serving: Callable[..., Deployment], api_key: Callable[..., str], gateway_url: str, site: Any
) -> None:
    site.MSHIP_CONCURRENCY_OVERFLOW = "reject"
    serving("sim", config={"reply": "word " * 10, "tokens_per_second": 20}, max_concurrency=1)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    body: dict[str, Any] = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    with sdk.chat.completions.create(**body, stream=True) as stream:
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as refused:
            sdk.chat.completions.create(**body)
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.code == "too_many_concurrent_requests"
    wait_until(lambda: not any(lim.by_deployment for lim in concurrency._by_loop.values()), 10)
    assert sdk.chat.completions.create(**body).choices[0].message.content  # free again


async def test_it_lets_a_late_burst_take_turns_with_a_steady_key(requests: Requests) -> None:
    chat, steady, late = route(cap=1), key(1), key(2)
    requests.send("steady-0", chat, steady)
    for n in range(1, 6):
        requests.send(f"steady-{n}", chat, steady)
    await settle()
    for n in range(3):  # the steady key has had turns while nobody else waited
        await requests.finish(f"steady-{n}")
    for n in range(4):
        requests.send(f"late-{n}", chat, late)
    await settle()
    await requests.finish("steady-3")
    await requests.finish(requests.served[-1])
    await requests.finish(requests.served[-1])
    # The late key's burst takes turns with the steady key: not all four first.
    assert requests.served[4:7] == ["late-0", "steady-4", "late-1"]
    for name in ("steady-5", "late-2", "late-3"):
        if name not in requests.served:
            await requests.finish(requests.served[-1])
    for task in requests.tasks.values():
        task.cancel()


async def test_it_lets_a_request_that_fits_go_while_others_wait_elsewhere(
    requests: Requests, settings: Any
) -> None:
    settings.MSHIP_ONDEMAND_MAX_QUEUED = 2
    busy, idle, capped = route(cap=1, deployment_id=1), route(cap=100, deployment_id=2), key(1)
    for n in range(3):
        requests.send(f"busy-{n}", busy, capped)
    await settle()
    assert len(requests.limits.waiting) == 2  # the list is full for that model
    requests.send("elsewhere", idle, key(2))
    await settle()
    assert "elsewhere" in requests.served  # not refused, not queued behind them
    with pytest.raises(GatewayError) as refused:  # the key that fills it: no more of it
        async with requests.limits.held(busy, capped):
            pass
    assert "model-1 has 1 requests in flight" in refused.value.message
    for task in requests.tasks.values():
        task.cancel()


async def test_it_makes_a_full_wait_list_refuse_the_key_holding_most_of_it(
    requests: Requests, settings: Any
) -> None:
    """Another key's newcomer takes the latest place of the key that holds the most: one
    key's burst cannot answer every other key 429."""
    settings.MSHIP_ONDEMAND_MAX_QUEUED = 3
    busy, burst, other = route(cap=1), key(1), key(2)
    for n in range(4):  # one holds the place, three fill the list
        requests.send(f"burst-{n}", busy, burst)
    await settle()
    requests.send("other-0", busy, other)
    await settle()
    refused = requests.tasks["burst-3"]
    assert refused.done() and isinstance(refused.exception(), GatewayError)
    error = refused.exception()
    assert isinstance(error, GatewayError)
    assert (error.status, error.code) == (429, "too_many_waiting_requests")
    assert "holds the most places" in error.message
    assert sum(t.key_id == 2 for t in requests.limits.waiting) == 1
    # 2 of burst's, 1 of other's: other's second would hold as many as burst: refused.
    with pytest.raises(GatewayError, match="in flight"):
        async with requests.limits.held(busy, other):
            pass
    assert not requests.tasks["burst-2"].done()
    await requests.finish("burst-0")
    assert requests.served[-1] == "other-0"  # its turn: burst had the place before
    for task in requests.tasks.values():
        task.cancel()


async def test_it_caps_one_keys_waiting_requests_so_another_key_still_waits_its_turn(
    requests: Requests, settings: Any
) -> None:
    settings.MSHIP_MAX_WAITING_PER_KEY = 2
    chat, burst, single = route(cap=1), key(1), key(2)
    for n in range(3):  # one holds the place, two wait: the key's share
        requests.send(f"burst-{n}", chat, burst)
    await settle()
    with pytest.raises(GatewayError) as refused:
        async with requests.limits.held(chat, burst):
            pass
    answer = refused.value
    assert (answer.status, answer.code) == (429, "too_many_waiting_requests")
    assert answer.headers == {"retry-after": "5"}
    requests.send("single", chat, single)  # another key still queues
    await settle()
    await requests.finish("burst-0")
    assert requests.served == ["burst-0", "single"]
    for name in ("single", "burst-1", "burst-2"):
        await requests.finish(name)


async def test_it_counts_the_wait_for_a_place_against_the_on_demand_queue_timeout(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One deadline from the request's arrival: one that waited 850 of the 900 s for a
    max_concurrency place has the 50 s left to wait for its model's start, not 900 s more
    (the two together ran to 1,800 s, past LiteLLM's 1,500)."""
    settings.MSHIP_CONCURRENCY_OVERFLOW = "queue"
    settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = 900
    clock = FakeClock()
    deployer = FakeDeployer(clock)
    deployer.add(1, "model-1", 2)
    ctl = Controller(deployer, clock)
    monkeypatch.setitem(registry._controllers, asyncio.get_running_loop(), ctl)
    slots = Dispatcher()
    slots.now = clock.now
    slots.on_demand = registry.ControllerSlots()
    cold = replace(route(cap=1), on_demand=True, state="stopped", urls=())
    let_go = asyncio.Event()

    async def holding() -> None:
        async with limits().held(cold, None):
            await let_go.wait()

    async def asking() -> None:
        async with slots.slot(cold):
            pass

    holder = asyncio.ensure_future(holding())
    await settle()
    request = asyncio.ensure_future(asking())
    await settle()
    assert len(limits().waiting) == 1
    await clock.advance(850)  # the place is held this long
    let_go.set()
    await holder
    await settle()
    assert deployer.starts == ["model-1"]  # then its start, which does not end in time
    await clock.advance(60)
    assert request.done()
    with pytest.raises(GatewayError) as refused:
        await request
    assert (refused.value.status, refused.value.code) == (503, "ondemand_queue_timeout")
    deployer.finish(1)
    await settle()
