"""Identity and scope at /v1: the trusted identity header only from trusted proxies, stored
responses out of reach of a key restricted to other models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")


def sdk(gateway_url: str, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway_url + "/v1", api_key=key, max_retries=0, default_headers=headers
    )


def test_it_believes_the_identity_header_only_from_a_trusted_proxy(
    gateway_url: str, api_key: Callable[..., str], serving: Any, site: Any
) -> None:
    site.MSHIP_TRUSTED_IDENTITY_HEADER = "x-user-id"
    serving("sim")
    alice_key, mallory_key = api_key("alice-app"), api_key("mallory-app")
    # No trusted proxies (the default): the header is ignored, each key is its own caller.
    alice = sdk(gateway_url, alice_key, **{"x-user-id": "alice"})
    stored = alice.responses.create(model="sim", input="hi")
    spoofed = sdk(gateway_url, mallory_key, **{"x-user-id": "alice"})
    with pytest.raises(openai.NotFoundError):
        spoofed.responses.retrieve(stored.id)
    # Once the proxy (loopback here) is trusted, the header names the caller across keys.
    site.MSHIP_TRUSTED_PROXY_CIDRS = ["127.0.0.0/8"]
    shared = alice.responses.create(model="sim", input="hi")
    other_app = sdk(gateway_url, mallory_key, **{"x-user-id": "alice"})
    assert other_app.responses.retrieve(shared.id).id == shared.id
    # A header value cannot pose as a key's identity, and is capped in length.
    with pytest.raises(openai.NotFoundError):
        sdk(gateway_url, mallory_key, **{"x-user-id": "key:1"}).responses.retrieve(stored.id)
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk(gateway_url, mallory_key, **{"x-user-id": "a" * 500}).models.list()
    assert too_long.value.code == "invalid_identity"


def test_it_never_sends_the_identity_header_to_the_engine(
    gateway_url: str, api_key: Callable[..., str], serving: Any, site: Any
) -> None:
    site.MSHIP_TRUSTED_IDENTITY_HEADER = "x-user-id"
    site.MSHIP_TRUSTED_PROXY_CIDRS = ["127.0.0.1"]
    sim = serving("sim")
    client = sdk(gateway_url, api_key(), **{"x-user-id": "alice"})
    client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}])
    seen = httpx.get(sim.engine_url + "/sim/last_chat_headers").json()
    assert seen and "x-user-id" not in {k.lower() for k in seen}


def test_it_keeps_a_restricted_key_from_stored_responses_of_other_models(
    gateway_url: str, api_key: Callable[..., str], serving: Any, site: Any
) -> None:
    site.MSHIP_TRUSTED_IDENTITY_HEADER = "x-user-id"
    site.MSHIP_TRUSTED_PROXY_CIDRS = ["127.0.0.1"]
    serving("open")
    serving("closed")
    user = {"x-user-id": "bob"}
    full = sdk(gateway_url, api_key("full"), **user)
    narrow = sdk(gateway_url, api_key("narrow", allowed_models=["open"]), **user)
    secret = full.responses.create(model="closed", input="the plan")
    mine = full.responses.create(model="open", input="hello")
    assert narrow.responses.retrieve(mine.id).id == mine.id  # same caller, allowed model
    with pytest.raises(openai.NotFoundError):
        narrow.responses.retrieve(secret.id)
    with pytest.raises(openai.NotFoundError):
        narrow.responses.input_items.list(secret.id)
    with pytest.raises(openai.NotFoundError):
        narrow.responses.delete(secret.id)
    with pytest.raises(openai.NotFoundError):
        narrow.responses.cancel(secret.id)
    with pytest.raises(openai.NotFoundError):  # continuing it through an allowed model
        narrow.responses.create(model="open", input="more", previous_response_id=secret.id)
    assert full.responses.retrieve(secret.id).id == secret.id  # still there
