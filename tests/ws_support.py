"""The Responses WebSocket as the official SDK opens it (`client.responses.connect()`), with
every server event checked against the Open Responses schema as it arrives."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.open_responses_schema import check_event

if TYPE_CHECKING:
    from openai.resources.responses.responses import ResponsesConnection

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def next_event(connection: ResponsesConnection) -> dict[str, Any]:
    """The next server event, checked: the schema, and that the SDK parses it."""
    raw = connection.recv_bytes()
    event: dict[str, Any] = json.loads(raw)
    if event["type"] != "error":
        check_event(event)
    assert connection.parse_event(raw).type == event["type"]
    return event


def until_done(connection: ResponsesConnection) -> list[dict[str, Any]]:
    """One response's events, to its terminal event (or an `error`)."""
    events = [next_event(connection)]
    while events[-1]["type"] not in TERMINAL:
        events.append(next_event(connection))
    return events


def final(events: list[dict[str, Any]]) -> dict[str, Any]:
    response: dict[str, Any] = events[-1]["response"]
    return response


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
