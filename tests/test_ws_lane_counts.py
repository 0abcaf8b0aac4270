"""A Responses socket's lanes are counted until they end, however they end: here a socket
whose creates and close are read in one go (their tasks cancelled before they began), which
must leave nothing counted, neither against the server's cap nor against its address's."""

from __future__ import annotations

import json
from typing import Any

from openai_api import ws_lanes
from openai_api.websocket import Socket


class AddressCount:
    """What the server's count of the socket's address sees (a ws_lanes.ClientLanes)."""

    def __init__(self) -> None:
        self.lanes = 0

    def full(self) -> bool:
        return False

    def lane_started(self) -> None:
        self.lanes += 1

    def lane_ended(self) -> None:
        self.lanes -= 1


async def test_it_releases_lanes_whose_responses_never_began() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    address = AddressCount()
    socket = Socket(send, {}, "127.0.0.1", address)
    before = ws_lanes.extra()
    for lane in ("a", "b", "c"):
        create = {"type": "response.create", "model": "sim", "input": "x", "stream_id": lane}
        await socket.received(json.dumps(create))
    assert (ws_lanes.extra() - before, address.lanes) == (2, 2)  # two beyond the first
    await socket.closed()  # at once: no task has run a step
    assert (ws_lanes.extra() - before, address.lanes) == (0, 0)
    assert sent == []
