"""Who may read /metrics: an address in MSHIP_METRICS_ALLOW (as the server sees it: behind a
proxy on the same host, the client's address the proxy sets), MSHIP_METRICS_TOKEN as a bearer
token, or a staff user's /api token (tests/test_metrics.py); and key prefixes label the request
counts only where MSHIP_METRICS_KEY_PREFIXES says so."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai

from openai_api.models import ApiKey
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

HI: list[Any] = [{"role": "user", "content": "hi"}]


def test_it_lets_a_scraper_with_the_metrics_token_read_from_anywhere(
    client: Any, site: Any, db: None
) -> None:
    site.MSHIP_METRICS_ALLOW = ["10.0.0.0/8"]  # the test client's 127.0.0.1 is not in it
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 401
    site.MSHIP_METRICS_TOKEN = "s3cret"
    allowed = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert allowed.status_code == 200 and "modelship_deployment_state" in allowed.text
    for wrong in ("Bearer s3cre", "Bearer s3cret0", "Bearer ", "Token s3cret", "s3cret"):
        refused = client.get("/metrics", HTTP_AUTHORIZATION=wrong)
        assert refused.status_code == 401, wrong
        assert "MSHIP_METRICS_TOKEN" in refused.json()["detail"]


def test_it_judges_the_address_a_proxy_on_the_same_host_sets(
    gateway_url: str, site: Any, transactional_db: None
) -> None:
    # The server takes X-Forwarded-For from a loopback peer (uvicorn's forwarded_allow_ips):
    # a proxy that sets it is judged by its client's address, not its own.
    assert httpx.get(gateway_url + "/metrics").status_code == 200
    proxied = httpx.get(gateway_url + "/metrics", headers={"x-forwarded-for": "203.0.113.9"})
    assert proxied.status_code == 401
    site.MSHIP_METRICS_TOKEN = "s3cret"
    with_token = httpx.get(
        gateway_url + "/metrics",
        headers={"x-forwarded-for": "203.0.113.9", "authorization": "Bearer s3cret"},
    )
    assert with_token.status_code == 200


def test_it_labels_request_counts_with_key_prefixes_only_when_asked(
    gateway_url: str, serving: Callable[..., Deployment], site: Any
) -> None:
    serving("sim")
    key, secret = ApiKey.issue("labelled")
    seen_by_gateway(lambda s: key.prefix in s.keys)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=secret, max_retries=0)
    label = f'key="msk-{key.prefix}"'

    sdk.chat.completions.create(model="sim", messages=HI)
    assert label not in httpx.get(gateway_url + "/metrics").text
    site.MSHIP_METRICS_KEY_PREFIXES = True
    sdk.chat.completions.create(model="sim", messages=HI)
    assert label in httpx.get(gateway_url + "/metrics").text
