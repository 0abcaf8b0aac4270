"""A token budget is reserved at admission, not only checked (issue 58, item 4): a burst of
a budgeted key is let in only as far as what each request can spend fits what is left, `n`
multiplies, a caller who leaves before the first byte pays for the prompt the engine read,
and a budgeted key runs a bounded number of requests at once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.db.models import Sum

from openai_api.catalog import Key
from openai_api.concurrency import _by_loop
from openai_api.errors import GatewayError
from openai_api.models import ApiKey
from openai_api.usage.budgets import Owner, budgets
from openai_api.usage.ledger import ledger
from openai_api.usage.models import UsageMinute
from openai_api.usage.recording import admit, most_tokens
from tests.conftest import wait_until
from tests.test_concurrency import route

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

    Serving = Callable[..., Deployment]

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.redis]
HELLO = [{"role": "user", "content": "say hello to me"}]
JSON = "application/json"


def body_of(**fields: Any) -> bytes:
    return json.dumps({"model": "sim", "messages": HELLO, **fields}).encode()


def used(key_id: int) -> dict[str, Any]:
    ledger.flush()
    return UsageMinute.objects.filter(key_id=key_id).aggregate(
        requests=Sum("requests"), tokens_in=Sum("tokens_in"), estimated=Sum("tokens_estimated")
    )


async def post_all(url: str, secret: str, bodies: list[bytes]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(
            *(
                client.post(
                    url + "/v1/chat/completions",
                    content=body,
                    headers={
                        "authorization": f"Bearer {secret}",
                        "content-type": "application/json",
                    },
                )
                for body in bodies
            )
        )


def test_it_lets_a_burst_in_only_as_far_as_its_reservations_fit(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    """20 requests at once of a key with 1,000 tokens a day, each able to spend its prompt
    and 50: once as many are in as fit, the rest are refused, not all let in."""
    # Slow enough that every request is in before the first ends (none gives back early).
    serving("sim", config={"reply": "hi", "first_token_delay_s": 3})
    secret = api_key("bursty", tokens_per_day=1000)
    body = body_of(max_tokens=50)
    each = len(body) // 4 + 50  # the gateway's estimate of the prompt, and its max_tokens
    answers = asyncio.run(post_all(gateway_url, secret, [body] * 20))
    served = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(served) == 1000 // each and len(served) + len(refused) == 20
    for answer in refused:
        error = answer.json()["error"]
        assert (
            error["code"] == "budget_exceeded"
            and "held by its requests under way" in (error["message"])
        )
        assert answer.headers["retry-after"] == "5"  # held places come back soon
    assert budgets.held == {}  # every request's hold released as it ended
    key = ApiKey.objects.get(name="bursty")
    wait_until(lambda: used(key.pk)["requests"] == 20, 10)


def test_it_multiplies_what_a_request_can_spend_by_n(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim", config={"reply": "hi"})
    secret = api_key("many", tokens_per_day=150)
    one, three = body_of(max_tokens=50), body_of(max_tokens=50, n=3)
    refused, served = asyncio.run(post_all(gateway_url, secret, [three]))[0], None
    assert refused.status_code == 429
    assert f"up to {len(three) // 4 + 150:,} tokens" in refused.json()["error"]["message"]
    served = asyncio.run(post_all(gateway_url, secret, [one]))[0]
    assert served.status_code == 200, served.text


def test_it_charges_the_prompt_of_a_caller_who_left_before_the_first_byte(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim", config={"reply": "hi", "first_token_delay_s": 5})
    secret = api_key("leaver", tokens_per_day=100_000)
    key = ApiKey.objects.get(name="leaver")
    body = body_of(max_tokens=10)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gateway_url + "/v1/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {secret}", "content-type": "application/json"},
            timeout=httpx.Timeout(30, read=0.5),
        )
    wait_until(lambda: (used(key.pk)["requests"] or 0) == 1, 15)
    found = used(key.pk)
    assert found["tokens_in"] == len(body) // 4 == found["estimated"]  # not 0: it was read
    wait_until(lambda: budgets.held == {}, 5)


def test_it_caps_a_budgeted_keys_requests_at_once(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, site: Any
) -> None:
    """A key with a budget and no max_concurrency of its own: MSHIP_BUDGET_MAX_CONCURRENCY
    at once on the site, the rest waiting their turn."""
    site.MSHIP_BUDGET_MAX_CONCURRENCY = 2
    serving("sim", config={"reply": "hi", "first_token_delay_s": 2})
    secret = api_key("capped", tokens_per_day=100_000)
    free = api_key("free")
    key = ApiKey.objects.get(name="capped")

    async def burst() -> list[httpx.Response]:
        going = asyncio.ensure_future(post_all(gateway_url, secret, [body_of(max_tokens=5)] * 4))

        def two_in_two_waiting() -> bool:  # the places of the gateway's event loop
            return any(
                held.by_key.get(key.pk) == 2 and sum(t.key_id == key.pk for t in held.waiting) == 2
                for held in list(_by_loop.values())
            )

        await asyncio.to_thread(wait_until, two_in_two_waiting, 20)
        # A key without a budget is not bound by it.
        other = await post_all(gateway_url, free, [body_of()] * 3)
        assert [a.status_code for a in other] == [200] * 3
        return await going

    assert [a.status_code for a in asyncio.run(burst())] == [200] * 4


async def test_it_holds_a_reservation_until_it_is_released(site: Any, db: None) -> None:
    owner = Owner("key", 9, "held-ref", "held", (("tokens_per_day", "tokens", "day", 100),))
    key = Key(9, "held", "held", "", False, frozenset(), None, budget_owners=(owner,))
    first = await admit(key, 60)
    assert first is not None and budgets.held == {"held-ref": 60}
    with pytest.raises(GatewayError) as refused:
        await admit(key, 41)
    assert "100 left" in refused.value.message and "60 of them held" in refused.value.message
    second = await admit(key, 40)
    assert second is not None
    budgets.release(first)
    budgets.release(first)  # once only
    assert budgets.held == {"held-ref": 40}
    budgets.release(second)
    assert budgets.held == {}
    assert await admit(key, 0) is None  # nothing to hold: checked only


def test_it_holds_a_background_runs_reservation_until_the_run_ends(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    """The POST ends at once; the run it queued spends the tokens: the hold goes with it."""
    serving("sim", config={"reply": "hi", "first_token_delay_s": 2})
    secret = api_key("background", tokens_per_day=100_000)
    ref = ApiKey.objects.get(name="background").prefix
    answer = httpx.post(
        gateway_url + "/v1/responses",
        json={"model": "sim", "input": "hi", "background": True, "max_output_tokens": 50},
        headers={"authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert answer.status_code == 200 and answer.json()["status"] == "queued", answer.text
    assert budgets.held.get(ref, 0) > 50  # the POST has ended; its run holds the tokens
    wait_until(lambda: budgets.held == {}, 20)


@pytest.mark.parametrize(
    ("endpoint", "body", "each", "copies"),
    [
        ("chat/completions", {"max_tokens": 1, "max_completion_tokens": 300}, 300, 1),
        ("chat/completions", {"max_output_tokens": 1}, 1000, 1),  # not chat's: the limit
        ("chat/completions", {"max_tokens": 10, "n": "64"}, 10, 64),  # as vLLM reads "64"
        ("chat/completions", {"max_tokens": 10, "n": 64.0}, 10, 64),
        ("chat/completions", {"max_tokens": 10, "n_predict": -1}, 1000, 1),  # llama: no end
        ("chat/completions", {"max_tokens": True}, 1000, 1),
        ("completions", {"max_tokens": 5, "prompt": ["a", "b", "c"], "best_of": 2}, 5, 6),
        ("responses", {"max_tokens": 1}, 1000, 1),  # the Responses API's is another field
        ("responses/compact", {}, 1000, 1),
    ],
)
def test_it_reserves_the_most_an_engine_may_make_of_any_spelling(
    endpoint: str, body: dict[str, Any], each: int, copies: int
) -> None:
    limited = dataclasses.replace(route(), max_output_tokens=1000)
    assert most_tokens(endpoint, limited, body, 400) == 100 + each * copies
