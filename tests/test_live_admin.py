"""The live admin's WebSocket (/ws/deployments) through the site's ASGI application: a staff
session gets every deployment, then each state change within 2 s, whichever process made it;
the on-demand counts a gateway publishes; nobody else connects."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission, User
from django.test import Client

from deployments import display
from deployments.models import Deployment, State
from deployments.transitions import transition
from modelship_site.asgi import application
from ondemand.count_sums import STALE_S, CountSums
from ondemand.counters import GROUP

if TYPE_CHECKING:
    from collections.abc import Callable

PAGE = b"http://127.0.0.1:8000"


pytestmark = [pytest.mark.redis]


def session_of(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def socket(cookie: bytes = b"", origin: bytes = PAGE) -> WebsocketCommunicator:
    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", origin)]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/deployments", headers=headers)


async def next_row(ws: WebsocketCommunicator, name: str) -> dict[str, Any]:
    """The next row message about `name` within 2 s (the host panel's may come between)."""
    while True:
        message = await ws.receive_json_from(timeout=2)
        if message["type"] == "row" and message["row"]["name"] == name:
            return dict(message["row"])


@pytest.fixture
def staff(transactional_db: None) -> User:
    return User.objects.create_superuser("ops", "o@example.com", "pw-123456")


async def test_it_sends_every_deployment_then_a_state_change_within_two_seconds(
    staff: User, make_deployment: Callable[..., Deployment]
) -> None:
    chat = await sync_to_async(make_deployment)("chat-small")
    await sync_to_async(make_deployment)("embed", mode="on_demand")
    ws = socket(await sync_to_async(session_of)(staff))
    connected, _ = await ws.connect()
    assert connected
    first = await ws.receive_json_from(timeout=5)
    assert first["type"] == "snapshot"
    rows = {r["name"]: r for r in first["rows"]}
    assert rows["chat-small"]["state"] == "planned" and rows["chat-small"]["phase"] is None
    assert rows["embed"]["phase"] == "sleeping" and rows["embed"]["queued"] == 0
    assert {"capacity_gib", "held_gib", "gpus"} <= set(first["host"])

    # An operator's stop, through the transition (the group tells the page at once).
    await sync_to_async(transition)(chat, State.STOPPED, expected=[State.PLANNED], reason="ops")
    row = await next_row(ws, "chat-small")
    assert (row["state"], row["reason"], row["colour"]) == ("stopped", "ops", "#495057")

    # A change made by another process without a channel layer in common: the watcher
    # reads it within the second.
    await sync_to_async(Deployment.objects.filter(pk=chat.pk).update)(state=State.FAILED)
    assert (await next_row(ws, "chat-small"))["state"] == "failed"

    # Removed: the page is told to drop its row.
    await sync_to_async(Deployment.objects.filter(pk=chat.pk).delete)()
    while (message := await ws.receive_json_from(timeout=2))["type"] != "gone":
        pass
    assert message["id"] == chat.pk
    await ws.disconnect()


async def test_it_shows_the_on_demand_counts_a_gateway_publishes(
    staff: User, make_deployment: Callable[..., Deployment]
) -> None:
    embed = await sync_to_async(make_deployment)("embed", mode="on_demand")
    ws = socket(await sync_to_async(session_of)(staff))
    assert (await ws.connect())[0]
    assert (await ws.receive_json_from(timeout=5))["type"] == "snapshot"
    await ws.send_to(text_data="not json")  # what a client sends is ignored, not fatal
    counts = {
        "inflight": 2,
        "queued": 3,
        "queued_since": 1.69e9,
        "last_request_at": 1.7e9,
        "phase": "queued",
    }
    await get_channel_layer().group_send(
        GROUP, {"type": "deployment.ondemand", "id": embed.pk, "ondemand": counts}
    )
    row = await next_row(ws, "embed")
    assert (row["inflight"], row["queued"], row["phase"]) == (2, 3, "queued")
    assert row["activity"] == "2 in flight · 3 queued"
    assert row["label"] == "queued · waiting for memory"
    assert row["queued_since"] == 1.69e9  # the dashboard's oldest wait
    await ws.disconnect()


async def test_it_sums_the_counts_of_every_gateway_process(
    staff: User, make_deployment: Callable[..., Deployment]
) -> None:
    embed = await sync_to_async(make_deployment)("embed", mode="on_demand")
    ws = socket(await sync_to_async(session_of)(staff))
    assert (await ws.connect())[0]
    assert (await ws.receive_json_from(timeout=5))["type"] == "snapshot"
    said = [
        ("worker-1", {"inflight": 2, "queued": 0, "last_request_at": 1.7e9, "phase": "serving"}),
        ("worker-2", {"inflight": 1, "queued": 4, "last_request_at": 1.8e9, "phase": "queued"}),
        ("worker-1", {"inflight": 3, "queued": 0, "last_request_at": 1.9e9, "phase": "serving"}),
    ]
    for process, counts in said:
        await get_channel_layer().group_send(
            GROUP,
            {
                "type": "deployment.ondemand",
                "id": embed.pk,
                "ondemand": {**counts, "process": process},
            },
        )
    row = await next_row(ws, "embed")
    while row["inflight"] != 4:  # the page folds what comes within a second into one row
        row = await next_row(ws, "embed")
    assert (row["inflight"], row["queued"], row["phase"]) == (4, 4, "queued")
    await ws.disconnect()


def test_it_stops_counting_a_process_it_no_longer_hears_from() -> None:
    now = [0.0]
    sums = CountSums(clock=lambda: now[0])
    busy = {"inflight": 2, "queued": 1, "last_request_at": 5.0, "phase": "queued"}
    sums.add(1, {**busy, "process": "a"})
    now[0] = STALE_S / 2
    assert (
        sums.add(1, {**busy, "inflight": 1, "queued": 0, "phase": "serving", "process": "b"})[
            "inflight"
        ]
        == 3
    )
    now[0] = STALE_S + 1  # a went quiet: it died, or its host did
    assert sums.summed(1) == {
        "inflight": 1,
        "queued": 0,
        "last_request_at": 5.0,
        "queued_since": None,
        "eta_s": None,
        "position": None,
        "phase": "serving",
    }
    now[0] = 2 * STALE_S
    assert sums.summed(1) is None


def test_it_shows_the_slowest_estimate_and_the_best_place_of_the_processes() -> None:
    sums = CountSums()
    waiting = {"inflight": 0, "queued": 1, "last_request_at": None, "phase": "queued"}
    sums.add(1, {**waiting, "position": 2, "eta_s": 40, "process": "a"})
    summed = sums.add(1, {**waiting, "position": 1, "eta_s": 70, "process": "b"})
    assert (summed["position"], summed["eta_s"]) == (1, 70)
    label = display.activity_label(0, summed["queued"], summed["position"], summed["eta_s"])
    assert label == "2 queued · place 1 in the queue · ready in about 70 s"


@pytest.mark.parametrize("who", ["anonymous", "not staff", "staff without view permission"])
async def test_it_refuses_whoever_may_not_see_the_deployments(
    transactional_db: None, who: str
) -> None:
    cookie = b""
    if who != "anonymous":
        user = await sync_to_async(User.objects.create_user)("u", password="pw-123456")
        user.is_staff = who != "not staff"
        await sync_to_async(user.save)()
        if who == "not staff":
            view = await sync_to_async(Permission.objects.get)(codename="view_deployment")
            await sync_to_async(user.user_permissions.add)(view)
        cookie = await sync_to_async(session_of)(user)
    ws = socket(cookie)
    connected, _ = await ws.connect()
    assert not connected


async def test_it_refuses_a_page_of_another_site(staff: User) -> None:
    """Cross-site WebSocket hijacking: the admin's cookie rides along from any page."""
    ws = socket(await sync_to_async(session_of)(staff), origin=b"https://evil.example")
    connected, _ = await ws.connect()
    assert not connected


async def test_it_sends_the_memory_per_gpu_as_it_changes(
    staff: User, site: Any, make_deployment: Callable[..., Deployment]
) -> None:
    site.MSHIP_GPU_INVENTORY = [(0, 10.0), (1, 10.0)]
    held = await sync_to_async(make_deployment)(
        "on-gpu-1", memory_gib=4, state=State.READY, gpus=[[1]]
    )
    ws = socket(await sync_to_async(session_of)(staff))
    assert (await ws.connect())[0]
    host = (await ws.receive_json_from(timeout=5))["host"]
    assert [(g["index"], g["held_gib"], g["free_gib"]) for g in host["gpus"]] == [
        (0, 0.0, 10.0),
        (1, 4.0, 6.0),
    ]
    assert host["gpus"][1]["deployments"] == [{"name": "on-gpu-1", "holding_gib": 4.0}]

    await sync_to_async(transition)(held, State.STOPPED, expected=[State.READY])
    while (message := await ws.receive_json_from(timeout=2))["type"] != "host":
        pass
    assert [g["held_gib"] for g in message["host"]["gpus"]] == [0.0, 0.0]
    await ws.disconnect()
