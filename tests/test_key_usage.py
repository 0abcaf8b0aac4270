"""A key holder's own view (issue 60, item 5): GET /v1/usage, authenticated by the key itself,
shows what the key used today and this month, its and its team's budgets and its rate limit,
and never another key's; every answer of a limited key carries x-ratelimit-* headers (README,
"A key's own usage")."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from ondemand.scheduler import client as scheduler_client
from ondemand.scheduler import owner as owner_module
from ondemand.scheduler.owner import Gateway, Owner
from openai_api.auth import RateLimiter
from openai_api.limit_headers import duration
from openai_api.models import ApiKey
from openai_api.usage.counters import sync
from openai_api.usage.models import Team
from tests.conftest import wait_until
from tests.test_scheduler_link import Written, heard

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from openai.types.chat import ChatCompletionMessageParam

    from deployments.models import Deployment

    Serving = Callable[..., Deployment]

# The rate window is in Redis on PostgreSQL + Redis, in this process on SQLite.
pytestmark = pytest.mark.redis
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say hello to me"}]
GO_DURATION = re.compile(r"(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)")


def client(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0)


def own_usage(sdk: openai.OpenAI) -> dict[str, Any]:
    return sdk.get("/usage", cast_to=dict[str, Any])


def limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.startswith("x-ratelimit-")}


def spent_each(answer: Any) -> int:
    return int(answer.usage.prompt_tokens + answer.usage.completion_tokens)


def midnight() -> str:
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    return f"{tomorrow:%Y-%m-%d}T00:00:00Z"


@pytest.mark.usefixtures("engines")
def test_it_shows_a_key_its_own_usage_and_its_and_its_teams_budgets(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim", config={"reply": "one two three four"})
    team = Team.objects.create(name="research", requests_per_day=100)
    mine = client(gateway_url, api_key("mine", team=team, tokens_per_day=10_000))
    theirs = client(gateway_url, api_key("theirs", team=team))
    answers = [
        mine.chat.completions.create(model="sim", messages=HELLO, max_tokens=10) for _ in range(2)
    ]
    wait_until(lambda: own_usage(mine)["today"]["requests"] == 2, 10)  # their records closed
    streamed = mine.chat.completions.with_raw_response.create(
        model="sim", messages=HELLO, max_tokens=10, stream=True
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["x-ratelimit-limit-tokens-day"] == "10000"  # on a stream too
    assert streamed.headers["x-ratelimit-remaining-tokens-day"] == str(
        10_000 - 2 * spent_each(answers[0])
    )
    assert len([chunk for chunk in streamed.parse() if chunk.choices]) > 0
    theirs.chat.completions.create(model="sim", messages=HELLO, max_tokens=2)
    per = answers[0].usage
    assert per is not None
    # A request's record closes just after its last byte: the figures follow at once.
    wait_until(lambda: own_usage(mine)["today"]["requests"] == 3, 10)
    wait_until(lambda: own_usage(theirs)["today"]["requests"] == 1, 10)
    for live in (False, True):  # the usage table's figures, then the budget check's own
        if live:
            sync.sync()
        seen = own_usage(mine)
        key = ApiKey.objects.get(name="mine")
        assert seen["object"] == "usage"
        assert seen["key"] == {"name": "mine", "prefix": f"msk-{key.prefix}", "team": "research"}
        spent = 3 * (per.prompt_tokens + per.completion_tokens)
        today = {
            "requests": 3,
            "tokens_in": 3 * per.prompt_tokens,
            "tokens_out": 3 * per.completion_tokens,
            "tokens": spent,
            "tokens_cached": 0,
        }
        assert {name: seen["today"][name] for name in today} == today
        assert seen["this_month"]["tokens"] == spent  # this month holds today
        assert seen["this_month"]["gpu_seconds"] == seen["today"]["gpu_seconds"] >= 0
        tokens, requests = seen["budgets"]
        assert tokens == {
            "owner": "key",
            "budget": "tokens_per_day",
            "counts": "tokens",
            "period": "day",
            "limit": 10_000,
            "used": spent,
            "remaining": 10_000 - spent,
            "percent": round(spent / 100, 1),
            "resets_at": midnight(),
        }
        # The team's: both keys' requests; key A's own figures hold none of key B's.
        assert (requests["owner"], requests["budget"], requests["limit"]) == (
            "team",
            "requests_per_day",
            100,
        )
        assert (requests["used"], requests["remaining"]) == (4, 96)
        assert seen["rate_limits"]["requests_per_minute"]["limit"] == 6000  # the site's
        assert own_usage(theirs)["today"]["tokens_out"] == 2


def test_it_tells_each_answer_what_the_limits_have_left(
    gateway_url: str, api_key: Callable[..., str]
) -> None:
    team = Team.objects.create(name="small", tokens_per_day=500, gpu_seconds_per_month=3600)
    secret = api_key("paced", team=team, requests_per_minute=4, tokens_per_day=1000)
    sdk = client(gateway_url, secret)
    first = sdk.models.with_raw_response.list()
    said = limit_headers(first.headers)
    assert said["x-ratelimit-limit-requests"] == "4"
    assert said["x-ratelimit-remaining-requests"] == "3"
    # Until its oldest arrival (this one) leaves the minute's window.
    assert re.fullmatch(r"1m0s|59\.\d+s", said["x-ratelimit-reset-requests"])
    # The tightest of the key's and its team's: the team's 500 tokens a day.
    assert (said["x-ratelimit-limit-tokens-day"], said["x-ratelimit-remaining-tokens-day"]) == (
        "500",
        "500",
    )
    gpu = [said[f"x-ratelimit-{part}-gpu-seconds-month"] for part in ("limit", "remaining")]
    assert gpu == ["3600", "3600"]
    for name in ("tokens-day", "gpu-seconds-month"):
        assert GO_DURATION.fullmatch(said[f"x-ratelimit-reset-{name}"])
    assert "x-ratelimit-limit-tokens-month" not in said  # no such budget
    # One fewer per request, an error answer included.
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="none-such", messages=HELLO)
    assert missing.value.response.headers["x-ratelimit-remaining-requests"] == "2"
    assert missing.value.response.headers["x-ratelimit-limit-tokens-day"] == "500"
    window = own_usage(sdk)["rate_limits"]["requests_per_minute"]
    assert (window["limit"], window["remaining"]) == (4, 1)
    assert 0 < window["resets_in_s"] <= 60
    last = sdk.models.with_raw_response.list()
    assert last.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as refused:
        sdk.models.list()
    headers = refused.value.response.headers
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == (
        "4",
        "0",
    )
    assert headers["x-ratelimit-reset-requests"] == duration(int(headers["retry-after"]))
    assert headers["x-ratelimit-remaining-tokens-day"] == "500"  # budgets said on a 429 too


def test_it_gives_a_key_without_limits_none_of_the_headers(
    gateway_url: str, api_key: Callable[..., str], site: Any
) -> None:
    site.MSHIP_DEFAULT_RPM = 0  # no site-wide rate either (6000 a minute unless set)
    sdk = client(gateway_url, api_key("free"))
    assert limit_headers(sdk.models.with_raw_response.list().headers) == {}
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="none-such", messages=HELLO)
    assert limit_headers(missing.value.response.headers) == {}
    seen = own_usage(sdk)
    assert seen["budgets"] == [] and seen["rate_limits"] == {"requests_per_minute": None}
    assert seen["key"]["team"] is None and seen["today"]["requests"] == 0


def test_it_takes_no_parameter_and_no_caller_without_a_key(
    gateway_url: str, api_key: Callable[..., str], site: Any
) -> None:
    secret = api_key("curious")
    other = ApiKey.issue("other")[0]
    sdk = client(gateway_url, secret)
    with pytest.raises(openai.BadRequestError) as asked:
        sdk.get(f"/usage?key={other.pk}", cast_to=object)
    assert asked.value.code == "unknown_parameter"
    assert asked.value.body["param"] == "key"  # type: ignore[index]
    assert asked.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as posted:
        sdk.post("/usage", cast_to=object, body={})
    assert (posted.value.status_code, posted.value.code) == (405, "method_not_allowed")
    anyone = httpx.get(gateway_url + "/v1/usage")
    assert anyone.status_code == 401  # a key is required here: the key is who asks
    site.MSHIP_AUTH = False  # a site that lets anonymous callers in
    open_site = httpx.get(gateway_url + "/v1/usage")
    assert open_site.status_code == 403
    error = open_site.json()["error"]
    assert error["code"] == "api_key_required" and "per API key" in error["message"]
    assert "x-ratelimit-remaining-requests" not in open_site.headers


class AskingLink:
    """A gateway's link that is up and asks a stand-in owner (client.admitted's side)."""

    def __init__(self, said: dict[str, Any]) -> None:
        self.up = asyncio.Event()
        self.up.set()
        self.hot: set[int] = set()
        self.said, self.notes = said, 0

    def _run(self) -> None:
        pass

    def _write(self, message: dict[str, Any]) -> None:
        self.notes += 1

    def new_ask(self, message: dict[str, Any]) -> dict[str, Any]:
        return message

    async def answer(self, ask: dict[str, Any]) -> dict[str, Any]:
        return self.said


async def test_it_says_what_the_sites_window_has_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the site's scheduler keeps the window: its owner says what is left when asked;
    a key well below a large limit, let in and told of, is given the bound (half left)."""
    monkeypatch.setattr(owner_module, "windows", RateLimiter())
    site = Owner(rebuild_s=0)
    site.rebuilt.set()
    written = Written()
    gateway = Gateway(site, written, "one")  # type: ignore[arg-type]
    for n in range(2):
        gateway.handle({"op": "rpm", "id": str(n), "key": 9, "limit": 5})
    await heard(written, lambda said: len(said) == 2)
    remaining = [m["ok"]["remaining"] for m in written.said]
    assert remaining == [4, 3]
    assert all(59_000 < m["ok"]["reset_ms"] <= 60_000 for m in written.said)
    link: Any = AskingLink({"remaining": 3, "reset_ms": 59_500})
    assert await scheduler_client.admitted(link, 9, 5) == (3, 59.5)  # asked: the owner's
    assert await scheduler_client.admitted(link, 10, 100) == (50, 60.0)  # told of: the bound
    assert link.notes == 1
    link.hot.add(10)  # near its limit: asked, its figures exact again
    assert await scheduler_client.admitted(link, 10, 100) == (3, 59.5)


def test_it_formats_resets_as_openai_does() -> None:
    assert [duration(s) for s in (0, 0.02, 1, 1.5, 59.999, 360, 3723.5, 86400)] == [
        "0s",
        "20ms",
        "1s",
        "1.5s",
        "59.999s",
        "6m0s",
        "1h2m3.5s",
        "24h0m0s",
    ]
