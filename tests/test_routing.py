"""Cache-aware routing through the real gateway, over three replicas of a simulated engine:
a conversation's turns return to its replica (chat, Responses), requests under one long
system prompt meet on one replica, the replica and the reason show in a header, the access
line and /metrics; and across two gateway processes the same choice, with the outstanding
counts and the conversations shared through Redis."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from redis import Redis

from deployments.runtimes.process import free_port
from openai_api.dispatch import dispatcher
from openai_api.models import ApiKey
from openai_api.routing.choice import choose
from openai_api.routing.hints import hint_of
from openai_api.routing.shared import affinity_key
from tests.conftest import as_gateway, wait_until
from tests.gateway_support import REDIS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from deployments.models import Deployment

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.redis]
# Longer than the prefix key (MSHIP_ROUTING_PREFIX_CHARS, 1000): it alone is the key.
SYSTEM = "You answer questions about the ledger of the accounts team. " * 30


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def chat(
    url: str, key: str, messages: list[dict[str, str]], headers: dict[str, str] | None = None
) -> httpx.Response:
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "trio", "messages": messages, "max_tokens": 4},
        headers={"authorization": f"Bearer {key}", **(headers or {})},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer


def routed(answer: httpx.Response) -> tuple[int, str]:
    return int(answer.headers["x-modelship-replica"]), answer.headers["x-modelship-routed-by"]


def opening(who: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": f"I am {who}."}]


def turn(messages: list[dict[str, str]], answer: httpx.Response, said: str) -> list[dict[str, str]]:
    reply = answer.json()["choices"][0]["message"]["content"]
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": said}]


@pytest.fixture
def trio(serving: Callable[..., Deployment], site: Any) -> Deployment:
    site.MSHIP_ROUTING_POLICY = "cache-aware"
    return serving("trio", num_replicas=3, config={"tokens_per_second": 200})


def test_it_returns_a_conversation_to_the_replica_holding_its_blocks_and_says_so(
    gateway_url: str,
    api_key: Callable[..., str],
    trio: Deployment,
    access_lines: list[dict[str, Any]],
) -> None:
    key = api_key()
    first = chat(gateway_url, key, opening("Ada"))
    home, reason = routed(first)
    assert reason == "prefix"
    # Its next turn: the replica that holds the most of its prompt's blocks (all of them).
    second = chat(gateway_url, key, turn(opening("Ada"), first, "And the total?"))
    assert routed(second) == (home, "cache")
    # Another conversation under the same long system prompt meets the same cached blocks.
    assert routed(chat(gateway_url, key, opening("Grace"))) == (home, "cache")
    # A short system prompt: no whole block; the opening is the key, and conversations spread.
    homes = {routed(chat(gateway_url, key, opening(f"n{i}", "Be brief.")))[0] for i in range(12)}
    assert len(homes) > 1
    wait_until(lambda: sum(1 for line in access_lines if line.get("routed_by")) >= 15)
    assert any(line.get("routed_by") == "cache" for line in access_lines)
    assert all(line["replica"] == home for line in access_lines if line.get("routed_by") == "cache")
    scraped = httpx.get(gateway_url + "/metrics").text
    assert 'modelship_routing_choices_total{model="trio",reason="cache"}' in scraped
    assert 'modelship_routing_choices_total{model="trio",reason="prefix"}' in scraped


def test_it_keeps_a_responses_chain_and_a_session_on_their_replica(
    gateway_url: str, api_key: Callable[..., str], trio: Deployment
) -> None:
    key = api_key()
    client = sdk(gateway_url, key)
    first = client.responses.with_raw_response.create(
        model="trio", instructions="Be brief.", input="Count to three."
    )
    home = first.headers["x-modelship-replica"]
    previous = first.parse().id
    for said in ("Again.", "Once more."):  # each turn names the one before
        answer = client.responses.with_raw_response.create(
            model="trio", input=said, previous_response_id=previous
        )
        assert answer.headers["x-modelship-replica"] == home
        assert answer.headers["x-modelship-routed-by"] == "affinity"
        previous = answer.parse().id
    # A caller's session header: its requests stay together whatever they say.
    session = {"x-modelship-session": "support-ticket-81"}
    placed = {
        routed(chat(gateway_url, key, opening(f"s{i}", "Be brief."), headers=session))
        for i in range(6)
    }
    assert len({replica for replica, _ in placed}) == 1
    assert {reason for _, reason in placed} == {"prefix", "affinity"}


def test_it_spreads_by_outstanding_under_that_policy(
    gateway_url: str, api_key: Callable[..., str], trio: Deployment, site: Any
) -> None:
    site.MSHIP_ROUTING_POLICY = "least-outstanding"
    key = api_key()
    placed = {routed(chat(gateway_url, key, opening("Ada"))) for _ in range(3)}
    assert placed == {(0, "load")}  # one at a time: each finds every replica idle


def test_it_weighs_what_each_engine_says_it_holds(
    gateway_url: str, api_key: Callable[..., str], trio: Deployment, site: Any
) -> None:
    """Streams sent to two engines directly (not through this gateway) count: the engines'
    own gauges say them, and the fewest-outstanding choice sends new requests to the third."""
    site.MSHIP_ROUTING_POLICY = "least-outstanding"
    key = api_key()
    urls = list(trio.engine_urls)
    body = {"model": "trio", "messages": HI_, "stream": True, "max_tokens": 2000}
    kept = []  # the streams' line readers: dropping one would close its stream
    with contextlib.ExitStack() as held:
        for url in urls[:2]:
            for _ in range(2):
                stream = held.enter_context(
                    httpx.stream(
                        "POST", url + "/v1/chat/completions", json=body, auth=as_gateway, timeout=60
                    )
                )
                kept.append(lines := stream.iter_lines())
                next(line for line in lines if line.startswith("data:"))
        # The gauges are read once a second after the first choice among these replicas.
        wait_until(lambda: routed(chat(gateway_url, key, opening("Ada")))[0] == 2, 10)
        assert {routed(chat(gateway_url, key, opening(f"n{i}")))[0] for i in range(4)} == {2}
    scraped = httpx.get(gateway_url + "/metrics").text
    assert 'modelship_routing_choices_total{model="trio",reason="load"}' in scraped


HI_ = [{"role": "user", "content": "Count slowly to a thousand."}]


@pytest.fixture
def shared_redis(site: Any) -> Iterator[Redis]:
    """The in-process gateway shares its routing through the Redis the other process uses."""
    site.REDIS_URL = REDIS
    client = Redis.from_url(REDIS)
    yield client
    client.close()


def test_it_shares_the_outstanding_counts_and_the_conversations_between_processes(
    other: str,
    gateway_url: str,
    api_key: Callable[..., str],
    trio: Deployment,
    shared_redis: Redis,
) -> None:
    secret = api_key("shared")
    owner = str(ApiKey.objects.get(name="shared").pk)
    wait_until(lambda: httpx.get(other + "/v1/models", headers=bearer(secret)).status_code == 200)
    urls = tuple(trio.engine_urls)
    x = opening("Ada", "Be brief.")  # a conversation
    tenant = f"key:{owner}"  # whose caches its prefixes meet (openai_api/cache_scope.py)
    home = urls.index(place(urls, x, tenant))
    # A stream of another opening that hashes to X's replica, held open through this process.
    held = next(
        m for i in range(500) if place(urls, m := opening(f"h{i}", "Hold."), tenant) == urls[home]
    )
    body = {"model": "trio", "messages": held, "stream": True, "max_tokens": 400}
    with httpx.stream(
        "POST", gateway_url + "/v1/chat/completions", json=body, headers=bearer(secret), timeout=30
    ) as stream:
        lines = stream.iter_lines()  # kept: dropping it would close the stream
        next(line for line in lines if line.startswith("data:"))  # on its engine now
        # The other process learns of it (within MSHIP_ROUTING_SYNC_S) and sends X elsewhere:
        # X's replica is at the bound (one outstanding of two, over three replicas).
        answers: list[httpx.Response] = []
        wait_until(lambda: routed(answers_of(answers, chat(other, secret, x)))[0] != home, 10)
        moved, reason = routed(answers[-1])
    assert reason in ("prefix", "affinity")
    # X's next turn, through this process (where X's replica is free again): the replica the
    # other process chose, read from Redis.
    conversation = hint_of({"messages": x}, {}, owner, 1000).conversation
    assert conversation is not None
    wait_until(lambda: shared_redis.get(affinity_key(conversation)) == urls[moved].encode(), 5)
    assert routed(chat(gateway_url, secret, turn(x, answers[-1], "More."))) == (moved, "affinity")


def answers_of(kept: list[httpx.Response], answer: httpx.Response) -> httpx.Response:
    kept.append(answer)
    return answer


def place(urls: tuple[str, ...], messages: list[dict[str, str]], tenant: str = "") -> str:
    """Where an idle deployment sends a conversation's first turn (of `tenant`'s requests)."""
    prefix = hint_of({"messages": messages}, {}, "", 1000, tenant).prefix
    return choose(urls, {}, prefix=prefix)[0]


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_it_routes_on_its_own_counts_while_redis_is_down(
    gateway_url: str,
    api_key: Callable[..., str],
    trio: Deployment,
    site: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    site.REDIS_URL = f"redis://127.0.0.1:{free_port('127.0.0.1')}/0"  # nothing listens
    site.MSHIP_ROUTING_SYNC_S = 0.05
    key = api_key()
    first = chat(gateway_url, key, opening("Ada", "Be brief."))
    shared = dispatcher.router.shared
    wait_until(lambda: shared.failing)  # the sync thread found Redis gone, and said so
    # The next conversation is not looked up in Redis (no request waits on it); the one
    # this process placed still returns to its replica.
    assert routed(chat(gateway_url, key, opening("Grace", "Be brief.")))[1] == "prefix"
    second = chat(gateway_url, key, turn(opening("Ada", "Be brief."), first, "More."))
    assert routed(second) == (routed(first)[0], "affinity")
    assert caplog.text.count("routing counts not shared through Redis") == 1
