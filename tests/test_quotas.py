"""Quotas per caller: stored-response bytes, background runs at once, a default rate limit;
and a request that cannot be served writes nothing before it is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from openai_api.models import StoredResponse
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.postgres]


def sdk(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0)


def test_it_refuses_to_store_more_than_the_callers_quota(
    gateway_url: str, api_key: Callable[..., str], serving: Any, site: Any
) -> None:
    serving("sim")
    site.MSHIP_RESPONSES_QUOTA_BYTES = 3000
    client = sdk(gateway_url, api_key())
    client.responses.create(model="sim", input="x" * 2000)
    with pytest.raises(openai.RateLimitError) as over:
        client.responses.create(model="sim", input="hi")
    assert over.value.code == "storage_quota_exceeded"
    assert client.responses.create(model="sim", input="hi", store=False).status == "completed"
    other = sdk(gateway_url, api_key("other"))  # another caller has its own quota
    assert other.responses.create(model="sim", input="hi").status == "completed"


def test_it_caps_a_callers_background_runs_at_once(
    gateway_url: str, api_key: Callable[..., str], serving: Any, site: Any
) -> None:
    serving("sim", config={"reply": "slow " * 50, "tokens_per_second": 5})
    site.MSHIP_MAX_BACKGROUND_RUNS = 1
    client = sdk(gateway_url, api_key())
    first = client.responses.create(model="sim", input="x", background=True)
    with pytest.raises(openai.RateLimitError) as busy:
        client.responses.create(model="sim", input="x", background=True)
    assert busy.value.code == "too_many_background_runs"
    assert client.responses.create(model="sim", input="x", max_output_tokens=2).status
    client.responses.cancel(first.id)
    assert client.responses.create(model="sim", input="x", background=True).status == "queued"


def test_it_limits_a_key_that_sets_no_rate_with_the_site_default(
    gateway_url: str, api_key: Callable[..., str], serving: Any, site: Any
) -> None:
    serving("sim")
    site.MSHIP_DEFAULT_RPM = 2
    client = sdk(gateway_url, api_key())
    for _ in range(2):
        client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}])


def test_it_writes_nothing_for_a_big_request_to_a_model_that_is_not_ready(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    make_deployment("down")  # always on, never started
    seen_by_gateway(lambda s: "down" in s.routes)
    big = {"model": "down", "input": "x" * (15 * 2**20), "background": True}
    answer = httpx.post(
        gateway_url + "/v1/responses",
        json=big,
        headers={"authorization": f"Bearer {api_key()}"},
        timeout=60,
    )
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "model_not_ready"
    assert not StoredResponse.objects.exists()
