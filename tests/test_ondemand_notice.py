"""The queued notice through /v1: a request that waits for memory is told so."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.db import connection

from deployments import deployer
from deployments.models import AuditEntry, Deployment
from ondemand.registry import controllers
from openai_api.keepalive import SseOpener
from openai_api.queued_notice import QueuedNotice
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def crowded(make_deployment: Any, site: Any, gateway_url: str, api_key: Any) -> Iterator[Any]:
    """8 GiB: an always-on model holds 3, an on-demand one holds 3 and is busy with a stream
    through the gateway; "waiting" (4 GiB) must queue. Yields a function that frees room."""
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    pinned = make_deployment("pinned", memory_gib=3)
    busy = make_deployment(
        "busy",
        memory_gib=3,
        mode="on_demand",
        idle_timeout_s=60,
        config={"tokens_per_second": 5, "max_tokens": 500},
    )
    make_deployment(
        "waiting",
        memory_gib=4,
        mode="on_demand",
        idle_timeout_s=60,
        config={"reply": "finally here"},
    )
    deployer.restart(pinned.pk)
    deployer.restart(busy.pk)
    seen_by_gateway(lambda s: s.routes["busy"].state == "ready" and "waiting" in s.routes)
    key = api_key()
    stream = httpx.stream(
        "POST",
        gateway_url + "/v1/chat/completions",
        timeout=60,
        headers={"authorization": f"Bearer {key}"},
        json={"model": "busy", "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    answer = stream.__enter__()
    lines = answer.iter_lines()
    next(lines)  # the busy model is serving through the gateway

    def free_room() -> None:
        stream.__exit__(None, None, None)
        deployer.stop(busy.pk, reason="freed by the test")

    yield key, free_room
    stream.__exit__(None, None, None)


def free_later(free_room: Callable[[], None], after: Callable[[], bool]) -> threading.Thread:
    def run() -> None:
        wait_until(after, 30)
        free_room()
        connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def queued_count() -> int:
    return sum(e.queued for c in controllers() for e in c.entries.values())


def test_it_streams_the_notice_first_then_the_engines_answer(
    gateway_url: str, crowded: Any
) -> None:
    key, free_room = crowded
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)
    freer = free_later(free_room, lambda: queued_count() > 0)
    chunks = list(
        client.chat.completions.create(
            model="waiting", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    freer.join()
    assert chunks[0].id == "ondemand-queued"
    assert chunks[0].model == "waiting"
    notice = chunks[0].choices[0].delta.content or ""
    # Its place, and an estimate: a minute, as no start of it was measured yet.
    assert "had to wait for memory to start (place 1 in the queue, about 60 s)" in notice
    text = "".join(c.choices[0].delta.content or "" for c in chunks[1:] if c.choices)
    assert text == "finally here"
    assert Deployment.objects.get(name="busy").state == "stopped"


def test_it_prepends_the_notice_to_a_plain_answer(gateway_url: str, crowded: Any) -> None:
    key, free_room = crowded
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)
    freer = free_later(free_room, lambda: queued_count() > 0)
    raw = client.chat.completions.with_raw_response.create(
        model="waiting", messages=[{"role": "user", "content": "x"}]
    )
    freer.join()
    content = raw.parse().choices[0].message.content or ""
    assert content.startswith("[waiting had to wait for memory")
    assert content.endswith("finally here")
    assert int(raw.headers["content-length"]) == len(raw.http_response.content)


def test_it_gives_no_notice_to_a_request_for_structured_output(
    gateway_url: str, crowded: Any
) -> None:
    key, free_room = crowded
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)
    freer = free_later(free_room, lambda: queued_count() > 0)
    answer = client.chat.completions.create(
        model="waiting",
        messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_object"},
    )
    freer.join()
    assert answer.choices[0].message.content == "finally here"


def test_it_ends_a_noticed_stream_with_an_error_event_on_timeout(
    gateway_url: str, crowded: Any, site: Any
) -> None:
    key, _ = crowded
    site.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = 1.0
    body = {"model": "waiting", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with httpx.stream(
        "POST",
        gateway_url + "/v1/chat/completions",
        json=body,
        timeout=30,
        headers={"authorization": f"Bearer {key}"},
    ) as answer:
        assert answer.status_code == 200
        events = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0])["id"] == "ondemand-queued"
    assert json.loads(events[1])["error"]["code"] == "ondemand_queue_timeout"
    assert events[2] == "[DONE]"
    # The operator sees it in the audit log, written by the gateway, with no user.
    wait_until(lambda: AuditEntry.objects.filter(action="ondemand_queue_timeout").exists(), 10)
    entry = AuditEntry.objects.get(action="ondemand_queue_timeout")
    assert (entry.actor, entry.user, entry.object_repr) == ("ondemand", None, "waiting")


async def test_it_tells_a_waiting_stream_of_an_install_on_v1_only() -> None:
    """/v1 streams hear that the start they wait for installs first; /ondemand (LiteLLM's
    way in) sends nothing before the engine answers, so a failed install stays a status."""
    for tells in (True, False):
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any], into: list[dict[str, Any]] = sent) -> None:
            into.append(message)

        notice = QueuedNotice(
            SseOpener(send, "rid"), "chat/completions", "painter", True, tells_preparing=tells
        )
        notice.on_preparing("installing its engine environment (sdcpp)")
        await notice.sent()
        bodies = b"".join(m.get("body", b"") for m in sent)
        assert (b"painter is installing its engine environment" in bodies) is tells, tells
        assert bool(sent) is tells  # nothing at all: not even the answer's start
