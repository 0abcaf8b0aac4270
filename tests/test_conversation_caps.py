"""A caller's conversations are capped (MSHIP_MAX_CONVERSATIONS, MSHIP_MAX_CONVERSATION_ITEMS),
their metadata counts in its storage quota, and the caps, the quota and the background-run
cap hold under concurrent requests: each check runs with its write, alone among the caller's
(openai_api/responses/quotas.py). The requests go to the real gateway from many threads at
once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from openai_api.models import Conversation, ConversationItem
from openai_api.responses.quotas import held_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")

THREADS = 16


def said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def at_once(n: int, call: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """`call` from n threads released together."""
    start = threading.Barrier(n)

    def one() -> httpx.Response:
        start.wait()
        return call()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: one(), range(n)))


def codes(answers: list[httpx.Response]) -> list[tuple[int, str | None]]:
    found = [(a.status_code, (a.json().get("error") or {}).get("code")) for a in answers]
    return sorted(found, key=lambda c: (c[0], c[1] or ""))


@pytest.fixture
def api(gateway_url: str, api_key: Callable[..., str]) -> httpx.Client:
    key = api_key()
    return httpx.Client(
        base_url=gateway_url + "/v1", headers={"authorization": f"Bearer {key}"}, timeout=60
    )


def test_it_caps_a_callers_conversations_under_a_burst(api: httpx.Client, site: Any) -> None:
    site.MSHIP_MAX_CONVERSATIONS = 5
    answers = at_once(THREADS, lambda: api.post("/conversations", json={}))
    assert codes(answers) == [(200, None)] * 5 + [(429, "too_many_conversations")] * 11
    assert Conversation.objects.count() == 5
    conversation = answers[[a.status_code for a in answers].index(200)].json()["id"]
    assert api.delete(f"/conversations/{conversation}").status_code == 200
    assert api.post("/conversations", json={}).status_code == 200  # room again


def test_it_caps_a_conversations_items_under_a_burst(api: httpx.Client, site: Any) -> None:
    site.MSHIP_MAX_CONVERSATION_ITEMS = 4
    made = api.post("/conversations", json={"items": [said("a"), said("b")]}).json()["id"]
    answers = at_once(
        THREADS, lambda: api.post(f"/conversations/{made}/items", json={"items": [said("c")]})
    )
    assert codes(answers) == [(200, None)] * 2 + [(400, "conversation_full")] * 14
    assert ConversationItem.objects.filter(conversation_id=made).count() == 4
    too_many = api.post("/conversations", json={"items": [said(str(n)) for n in range(5)]})
    assert (too_many.status_code, too_many.json()["error"]["code"]) == (400, "conversation_full")


def test_it_never_lets_a_burst_pass_the_storage_quota(api: httpx.Client, site: Any) -> None:
    site.MSHIP_RESPONSES_QUOTA_BYTES = 5000
    made = api.post("/conversations", json={}).json()["id"]
    item = said("x" * 900)  # about 1,000 bytes stored
    answers = at_once(
        THREADS, lambda: api.post(f"/conversations/{made}/items", json={"items": [item]})
    )
    statuses = [a.status_code for a in answers]
    assert set(statuses) == {200, 429}
    identity = Conversation.objects.get(pk=made).identity
    assert held_bytes(identity) <= 5000
    assert statuses.count(200) == 4  # what fits: 2 bytes of metadata and 4 items of ~1,000


def test_it_counts_metadata_in_the_storage_quota(api: httpx.Client, site: Any) -> None:
    site.MSHIP_RESPONSES_QUOTA_BYTES = 4000
    metadata = {f"key{n}": "v" * 500 for n in range(16)}  # about 8,000 bytes
    refused = api.post("/conversations", json={"metadata": metadata})
    assert (refused.status_code, refused.json()["error"]["code"]) == (
        429,
        "storage_quota_exceeded",
    )
    small = api.post("/conversations", json={"metadata": {"a": "b"}}).json()["id"]
    grown = api.post(f"/conversations/{small}", json={"metadata": metadata})
    assert grown.status_code == 429
    assert Conversation.objects.get(pk=small).metadata == {"a": "b"}
    few = {f"key{n}": "v" * 500 for n in range(4)}  # about 2,000 bytes: fits
    assert api.post(f"/conversations/{small}", json={"metadata": few}).status_code == 200
    assert held_bytes(Conversation.objects.get(pk=small).identity) > 2000


def test_it_refuses_a_response_in_a_full_conversation(
    api: httpx.Client, serving: Callable[..., Any], site: Any
) -> None:
    serving("sim", config={"reply": "ok"})
    site.MSHIP_MAX_CONVERSATION_ITEMS = 2
    made = api.post("/conversations", json={"items": [said("a"), said("b")]}).json()["id"]
    answer = api.post("/responses", json={"model": "sim", "input": "c", "conversation": made})
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "message": "The conversation has 2 items, its limit: delete some or start another"
        " conversation.",
        "type": "invalid_request_error",
        "code": "conversation_full",
        "param": "conversation",
    }


def test_it_caps_background_runs_under_a_burst(
    api: httpx.Client, serving: Callable[..., Any], site: Any
) -> None:
    serving("sim", config={"reply": "word " * 100, "tokens_per_second": 20})
    site.MSHIP_MAX_BACKGROUND_RUNS = 3
    body = {"model": "sim", "input": "x", "background": True}
    answers = at_once(THREADS, lambda: api.post("/responses", json=body))
    assert codes(answers) == [(200, None)] * 3 + [(429, "too_many_background_runs")] * 13
    for answer in answers:
        if answer.status_code == 200:
            api.post(f"/responses/{answer.json()['id']}/cancel")
