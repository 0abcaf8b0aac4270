"""Usage and budgets at the gateway: every request's tokens and GPU-seconds in the usage
table, streams' usage asked of the engine and kept from clients that did not ask, budgets
that refuse the next request once used up (README, "Usage and budgets")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.db import DatabaseError
from django.db.models import Sum

from deployments import deployer
from deployments.models import AuditEntry, Deployment
from openai_api.catalog import Key
from openai_api.errors import GatewayError
from openai_api.models import ApiKey
from openai_api.tasks import sweep_usage
from openai_api.usage.budgets import Budgets, Owner
from openai_api.usage.counters import CounterSync, sync
from openai_api.usage.ledger import Ledger, ledger
from openai_api.usage.models import Team, UsageMinute
from openai_api.usage.recording import admit
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

Serving = Callable[..., Deployment]
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say hello to me"}]


pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def client(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0)


def usage_of(**filters: Any) -> dict[str, Any]:
    ledger.flush()
    found = UsageMinute.objects.filter(**filters).aggregate(
        requests=Sum("requests"),
        errors=Sum("errors"),
        tokens_in=Sum("tokens_in"),
        tokens_out=Sum("tokens_out"),
        estimated=Sum("tokens_estimated"),
        gpu_seconds=Sum("gpu_seconds"),
        images=Sum("images"),
        characters=Sum("characters"),
        audio_s=Sum("audio_s"),
    )
    return {name: value or 0 for name, value in found.items()}


def usage_once(requests: int, **filters: Any) -> dict[str, Any]:
    """`usage_of` once `requests` requests are counted: a request's record closes just after
    its answer's last byte went out, so a client can have the answer a moment before."""
    wait_until(lambda: usage_of(**filters)["requests"] >= requests, 10)
    return usage_of(**filters)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_counts_a_streams_usage_by_the_engine_and_keeps_it_from_a_client_that_did_not_ask(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    deployment = serving("sim", config={"reply": "one two three four"})
    Deployment.objects.filter(pk=deployment.pk).update(num_gpus=1)
    seen_by_gateway(lambda s: s.routes["sim"].gpu_shares == (1.0,))
    secret = api_key("app")
    key = ApiKey.objects.get(name="app")
    sdk = client(gateway_url, secret)
    chunks = list(sdk.chat.completions.create(model="sim", messages=HELLO, stream=True))
    assert chunks and all(chunk.usage is None for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "one two three four"
    )
    asked = list(
        sdk.chat.completions.create(
            model="sim", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    engine_usage = asked[-1].usage
    assert engine_usage is not None and engine_usage.prompt_tokens == 4
    whole = sdk.chat.completions.create(model="sim", messages=HELLO)
    assert whole.usage is not None
    used = usage_once(3, key_id=key.pk, deployment="sim")
    assert used["requests"] == 3
    assert used["tokens_in"] == 3 * engine_usage.prompt_tokens
    assert (
        used["tokens_out"]
        == 3 * engine_usage.completion_tokens
        == 3 * whole.usage.completion_tokens
    )
    assert used["estimated"] == 0
    assert used["gpu_seconds"] > 0  # a GPU share of 1, held while each request ran


def test_it_counts_a_client_that_hangs_up_by_its_own_estimate(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim", config={"tokens_per_second": 20})
    secret = api_key("leaver")
    key = ApiKey.objects.get(name="leaver")
    body = {"model": "sim", "messages": HELLO, "stream": True, "max_tokens": 200}
    with httpx.stream(
        "POST",
        gateway_url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {secret}"},
    ) as answer:
        lines = answer.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few tokens, then the client leaves
    assert any(line.startswith("data:") for line in got)

    def counted() -> bool:
        return usage_of(key_id=key.pk)["requests"] == 1

    wait_until(counted, 10)
    used = usage_of(key_id=key.pk)
    assert 1 <= used["tokens_out"] < 200  # what was generated for it, not what it asked
    assert used["estimated"] == used["tokens_in"] + used["tokens_out"]
    assert used["tokens_in"] > 0


def test_it_lets_in_only_what_fits_a_token_budget_and_counts_what_it_spent(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, site: Any
) -> None:
    """The most a request can spend (its prompt, estimated from its size, and its
    max_tokens) must fit what is left; what it spent is what counts after."""
    serving("sim", config={"reply": " ".join(["word"] * 45)})
    secret = api_key("capped", tokens_per_day=100)
    sdk = client(gateway_url, secret)
    with pytest.raises(openai.RateLimitError) as refused:
        sdk.chat.completions.create(model="sim", messages=HELLO, max_tokens=500)
    error = refused.value
    assert error.code == "budget_exceeded"
    assert "may use up to" in error.message and "tokens_per_day" in error.message
    assert "has 100 left" in error.message
    tomorrow = datetime.now(UTC).date().toordinal() + 1
    assert f"{datetime.fromordinal(tomorrow):%Y-%m-%d}" not in error.message  # not used up
    assert 0 < int(error.response.headers["retry-after"]) <= 86400  # nothing held: the reset
    assert error.response.headers["x-modelship-budget"] == "key:tokens_per_day"
    words = [
        c.choices[0].delta.content
        for c in sdk.chat.completions.create(
            model="sim", messages=HELLO, stream=True, max_tokens=45
        )
        if c.choices and c.choices[0].delta.content
    ]
    assert len(words) == 45
    used = usage_once(2)
    assert used["tokens_in"] + used["tokens_out"] == 4 + 45  # what the engine counted
    with pytest.raises(openai.RateLimitError, match="has 51 left"):
        sdk.chat.completions.create(model="sim", messages=HELLO, max_tokens=45)
    small = sdk.chat.completions.create(model="sim", messages=HELLO, max_tokens=5)
    assert small.usage is not None and small.usage.completion_tokens == 5
    assert usage_once(4)["requests"] == 4  # the refused requests count as requests


def test_it_holds_a_teams_budget_over_its_keys_and_warns_first(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, site: Any
) -> None:
    serving("sim")
    team = Team.objects.create(name="research", requests_per_day=5)
    first = client(gateway_url, api_key("first", team=team))
    second = client(gateway_url, api_key("second", team=team))
    for sdk in (first, second, first, second):
        sdk.chat.completions.create(model="sim", messages=HELLO)
    sync.sync()
    warning = AuditEntry.objects.get(action="budget.warning", object_repr="team research")
    assert "requests_per_day" in warning.text and "4 of 5 requests" in warning.text
    second.chat.completions.create(model="sim", messages=HELLO)  # the fifth: its last
    for sdk in (first, second):
        with pytest.raises(openai.RateLimitError) as refused:
            sdk.chat.completions.create(model="sim", messages=HELLO)
        assert "team 'research'" in refused.value.message
    Team.objects.filter(pk=team.pk).update(requests_per_day=50)  # raised: applies at once
    seen_by_gateway(
        lambda s: all(o.limits[0][3] == 50 for k in s.keys.values() for o in k.budget_owners)
    )
    first.chat.completions.create(model="sim", messages=HELLO)


def test_it_holds_budgets_across_gateway_processes(site: Any, db: None) -> None:
    """Two processes' counters (each its own budgets and sync): what one used, the other
    refuses by, within a refresh (through Redis where REDIS_URL is set, else the usage
    table once the first flushed)."""
    key, _ = ApiKey.issue("shared", gpu_seconds_per_day=100)
    owner = Owner(
        "key", key.pk, key.prefix, key.name, (("gpu_seconds_per_day", "gpu_seconds", "day", 100),)
    )
    one, two = Budgets(), Budgets()
    one_ledger, two_ledger = Ledger(), Ledger()
    one_sync, two_sync = CounterSync(one, one_ledger), CounterSync(two, two_ledger)
    two.check((owner,))
    one.check((owner,))
    one.add((owner,), 0, 120.0)
    minute = int(datetime.now(UTC).timestamp()) // 60 * 60
    one_ledger.add((minute, key.pk, 0, "sim"), [1, 0, 0, 0, 0, 0, 120.0, 1, 0, 0, 0, 0, 0, 0])
    with pytest.raises(Exception, match="budget gpu_seconds_per_day"):
        one.check((owner,))  # its own use, before any sync
    two.check((owner,))  # the other process has not heard yet
    one_ledger.flush()
    one_sync.sync()
    two_sync.sync()
    with pytest.raises(Exception, match="120 of 100 GPU-seconds"):
        two.check((owner,))
    with pytest.raises(Exception, match="budget gpu_seconds_per_day"):
        one.check((owner,))  # still, once its own count became the shared total


def test_it_adds_every_flush_to_the_minutes_row_and_keeps_a_failed_one(db: None) -> None:
    minute = int(datetime(2026, 12, 1, 10, 30, tzinfo=UTC).timestamp())
    book = Ledger()
    row = (minute, 7, 3, "sim")
    book.add(row, [1, 0, 10, 20, 0, 0, 1.5, 0.2, 0.1, 1, 0, 0.0, 0, 0])
    book.add(row, [1, 1, 5, 0, 0, 5, 0.5, 0.3, 0.0, 0, 0, 0.0, 0, 0])
    assert book.flush()
    book.add(row, [1, 0, 1, 2, 0, 0, 0.0, 0.1, 0.0, 0, 2, 0.0, 9, 0])
    assert book.flush()
    stored = UsageMinute.objects.get()
    assert stored.minute == datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
    assert (stored.requests, stored.errors, stored.tokens_in, stored.tokens_out) == (3, 1, 16, 22)
    assert (stored.tokens_estimated, stored.images, stored.characters) == (5, 2, 9)
    assert stored.gpu_seconds == pytest.approx(2.0)

    def broken(rows: dict[Any, list[float]]) -> None:
        raise DatabaseError("the database is down")

    failing = Ledger(writer=broken)
    failing.add(row, [1, 0, 4, 4, 0, 0, 0.0, 0.1, 0.0, 0, 0, 0.0, 0, 0])
    assert not failing.flush()
    assert failing.retry[row][2] == 4  # kept for the next flush
    failing.writer = Ledger().writer
    assert failing.flush()
    assert UsageMinute.objects.get().tokens_in == 20


def test_it_counts_a_transcriptions_audio_seconds(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("ears", usecase="transcription")
    secret = api_key("ears")
    answer = httpx.post(
        gateway_url + "/v1/audio/transcriptions",
        data={"model": "ears"},
        files={"file": ("two-seconds.wav", b"\0" * 64000, "audio/wav")},
        headers={"authorization": f"Bearer {secret}"},
    )
    assert answer.status_code == 200, answer.text
    assert usage_once(1, deployment="ears")["audio_s"] == pytest.approx(2.0)


def test_it_writes_the_usage_in_the_access_line(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, access_lines: Any
) -> None:
    serving("sim")
    team = Team.objects.create(name="web")
    sdk = client(gateway_url, api_key("site", team=team))
    sdk.chat.completions.create(model="sim", messages=HELLO)
    chats = lambda: [x for x in access_lines if x["endpoint"] == "chat/completions"]  # noqa: E731
    wait_until(lambda: bool(chats()), 10)
    line = chats()[-1]
    assert line["team"] == "web" and line["tokens_estimated"] == 0
    assert line["tokens_in"] == 4 and "gpu_seconds" in line


def test_it_sweeps_usage_past_its_retention(site: Any, db: None) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    for days in (0, 10, 40):
        UsageMinute.objects.create(minute=now - timedelta(days=days), key_id=days, requests=1)
    site.MSHIP_USAGE_RETENTION_DAYS = 30
    assert sweep_usage() == 1
    assert sorted(UsageMinute.objects.values_list("key_id", flat=True)) == [0, 10]
    site.MSHIP_USAGE_RETENTION_DAYS = 0  # kept forever
    assert sweep_usage() == 0


@pytest.mark.usefixtures("engines")  # the engine it starts is stopped after it
def test_it_holds_a_budget_over_two_gateway_processes(
    two_gateways: list[str], make_deployment: Any
) -> None:
    """The process that served a request refuses the next at once (its own count); the
    other within a refresh (Redis where REDIS_URL is set, else the usage table)."""
    sim = make_deployment("sim", config={"reply": " ".join(["word"] * 45)})
    deployer.restart(sim.pk)
    _, secret = ApiKey.issue("shared", tokens_per_day=100)
    a, b = (
        openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0, timeout=30)
        for url in two_gateways
    )
    # 4 + 45 tokens spent; each request may spend its prompt's estimate (about 20) and 45.
    assert a.chat.completions.create(model="sim", messages=HELLO, max_tokens=45).choices
    with pytest.raises(openai.RateLimitError, match="tokens_per_day"):
        a.chat.completions.create(model="sim", messages=HELLO, max_tokens=45)

    def b_refuses() -> bool:
        try:
            b.chat.completions.create(model="sim", messages=HELLO, max_tokens=45)
        except openai.RateLimitError as refused:
            return refused.code == "budget_exceeded"
        return False

    wait_until(b_refuses, 10)


def test_it_serves_on_or_refuses_as_told_while_budget_totals_cannot_be_read(
    site: Any, db: None
) -> None:
    limits = (("requests_per_day", "requests", "day", 1000),)
    owner = Owner("key", 1, "stale-ref", "app", limits)
    counted = Budgets()
    counted.check((owner,))
    site.MSHIP_BUDGET_STALE_S = 30
    counted.synced_at -= 31  # no totals read for longer than that: Redis and the table down
    site.MSHIP_BUDGET_FAILURE = "open"
    counted.check((owner,))  # the last totals and this process's own count
    site.MSHIP_BUDGET_FAILURE = "closed"
    with pytest.raises(GatewayError) as refused:
        counted.check((owner,))
    assert (refused.value.status, refused.value.code) == (503, "budget_unavailable")
    counted.settle({}, {})  # totals read again
    counted.check((owner,))


def test_it_counts_a_background_run_by_its_response_and_the_post_once(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim", config={"reply": "done in the background"})
    secret = api_key("batch")
    key = ApiKey.objects.get(name="batch")
    sdk = client(gateway_url, secret)
    queued = sdk.responses.create(model="sim", input="later please", background=True)
    found: list[Any] = []

    def done() -> bool:
        found[:] = [sdk.responses.retrieve(queued.id)]
        return found[0].status == "completed"

    wait_until(done, 30)
    usage = found[0].usage
    assert usage is not None and usage.output_tokens > 0

    def counted() -> bool:  # the run's record ends just after its response is stored
        return usage_of(key_id=key.pk, deployment="sim")["tokens_out"] > 0

    wait_until(counted, 10)
    used = usage_of(key_id=key.pk, deployment="sim")
    assert used["requests"] == 1  # the POST; the run's usage is counted as its part
    assert (used["tokens_in"], used["tokens_out"]) == (usage.input_tokens, usage.output_tokens)
    assert used["estimated"] == 0


async def test_it_counts_a_request_against_a_daily_request_budget_when_it_is_let_in(
    site: Any, db: None
) -> None:
    """A burst of concurrent requests cannot pass requests_per_day: each counts on entry."""
    limits = (("requests_per_day", "requests", "day", 3),)
    owner = Owner("key", 7, "burst-ref", "bursty", limits)
    key = Key(7, "bursty", "burst", "", False, frozenset(), None, budget_owners=(owner,))
    for _ in range(3):
        await admit(key)  # none of them has ended yet
    with pytest.raises(GatewayError) as refused:
        await admit(key)
    assert refused.value.code == "budget_exceeded"
