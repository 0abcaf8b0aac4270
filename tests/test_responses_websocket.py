"""The Responses API over a WebSocket, with the official SDK's `client.responses.connect()`:
several responses on one socket, chaining, lanes, errors that leave the socket open, a
close that cancels the engine request, the handshake's refusals, stored state, on-demand
starts."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import websockets
from django.db.models import Sum
from websockets.sync.client import connect

from openai_api import websocket
from openai_api.models import ApiKey
from openai_api.usage.ledger import ledger
from openai_api.usage.models import UsageMinute
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway
from tests.open_responses_schema import conforming_sdk
from tests.ws_support import final, next_event, text_of, until_done

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return conforming_sdk(gateway_url, api_key())


def engine_saw(deployment: Deployment) -> list[str]:
    deployment.refresh_from_db()
    body = httpx.get(deployment.engine_url + "/sim/last_chat_request").json()
    return [str(m["content"]) for m in body["messages"] if m["role"] != "system"]


def engine_stats(deployment: Deployment) -> dict[str, Any]:
    deployment.refresh_from_db()
    return dict(httpx.get(deployment.engine_url + "/sim/stats").json())


def cancellations(deployment: Deployment) -> int:
    deployment.refresh_from_db()
    return int(httpx.get(deployment.engine_url + "/sim/cancellations").json()["count"])


def test_it_answers_three_responses_on_one_socket_each_continuing_the_last(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "one two three", "reasoning": "hmm"})
    with client.responses.connect() as connection:
        connection.response.create(model="sim", input="first")
        first = until_done(connection)
        kinds = [e["type"] for e in first]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        assert text_of(first) == "one two three"
        # Not stored: the socket remembers it for the next turn all the same.
        connection.response.create(
            model="sim", input="second", previous_response_id=final(first)["id"], store=False
        )
        second = until_done(connection)
        assert final(second)["previous_response_id"] == final(first)["id"]
        connection.response.create(
            model="sim", input="third", previous_response_id=final(second)["id"]
        )
        third = until_done(connection)
    assert final(third)["status"] == "completed"
    assert engine_saw(sim) == ["first", "one two three", "second", "one two three", "third"]
    # Stored as over HTTP (the first and third), and continuable over HTTP.
    assert client.responses.retrieve(final(first)["id"]).output_text == "one two three"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final(second)["id"])
    client.responses.create(model="sim", input="fourth", previous_response_id=final(third)["id"])
    assert engine_saw(sim)[-2:] == ["one two three", "fourth"]


def test_it_warms_up_without_calling_the_engine(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "go"})
    with client.responses.connect() as connection:
        connection.response.create(
            model="sim", input="the long context", instructions="be brief", generate=False
        )
        warm = final(until_done(connection))
        assert (warm["status"], warm["output"]) == ("completed", [])
        assert engine_stats(sim)["served"] == 0
        connection.response.create(model="sim", input="now", previous_response_id=warm["id"])
        assert text_of(until_done(connection)) == "go"
    assert engine_saw(sim) == ["the long context", "now"]


def test_it_sends_errors_as_events_and_keeps_the_socket_open(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "fine"})
    with client.responses.connect() as connection:
        refused = []
        for event in (
            {"model": "sim", "input": "x", "background": True},
            {"model": "nope", "input": "x"},
            {"model": "sim", "input": "x", "temperature": "hot"},
            {"model": "sim", "input": "x", "previous_response_id": "resp_missing"},
        ):
            connection.response.create(**event)
            [error] = until_done(connection)
            refused.append((error["status"], error["error"]["code"], error["error"]["param"]))
        connection.send({"type": "response.steer", "input": "x", "previous_response_id": "r"})
        [unsupported] = until_done(connection)
        connection._connection.send("not json")  # the SDK's socket, raw
        [not_json] = until_done(connection)
        connection.response.create(model="sim", input="still here")
        answered = until_done(connection)
    assert refused == [
        (400, "invalid_request", "background"),
        (404, "model_not_found", None),
        (400, "invalid_request", "temperature"),
        (400, "previous_response_not_found", "previous_response_id"),
    ]
    assert unsupported["error"]["param"] == "type"
    assert not_json["error"]["type"] == "invalid_request_error"
    assert text_of(answered) == "fine"


def test_it_continues_a_response_of_another_socket_only_if_it_was_stored(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "ok"})
    with client.responses.connect() as connection:
        connection.response.create(model="sim", input="unstored", store=False)
        unstored = final(until_done(connection))["id"]
        connection.response.create(model="sim", input="stored")
        stored = final(until_done(connection))["id"]
    with client.responses.connect() as connection:  # a reconnect
        connection.response.create(model="sim", input="x", previous_response_id=unstored)
        [missing] = until_done(connection)
        connection.response.create(model="sim", input="x", previous_response_id=stored)
        continued = final(until_done(connection))
        connection.response.create(model="sim", input="start again", store=False)
        recovered = final(until_done(connection))
    assert missing == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": f"Previous response with id {unstored!r} not found.",
            "param": "previous_response_id",
        },
    }
    assert continued["status"] == recovered["status"] == "completed"


def test_it_forgets_the_response_a_failed_continuation_continued(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "ok"})
    stray: Any = {"type": "function_call_output", "call_id": "call_nobody_made", "output": "x"}
    with client.responses.connect() as connection:
        ids = {}
        for store in (False, True):
            connection.response.create(model="sim", input="remember", store=store)
            ids[store] = final(until_done(connection))["id"]
        refused, retried = [], []
        for store in (False, True):
            connection.response.create(model="sim", input=[stray], previous_response_id=ids[store])
            refused.append(until_done(connection)[-1])
            connection.response.create(model="sim", input="again", previous_response_id=ids[store])
            retried.append(until_done(connection)[-1])
    assert [(e["status"], e["error"]["code"]) for e in refused] == [(400, "invalid_request")] * 2
    # Not stored: gone with the failure. Stored: continued from the store, as on a new socket.
    assert retried[0]["error"]["code"] == "previous_response_not_found"
    assert retried[1]["type"] == "response.completed"
    assert engine_saw(sim) == ["remember", "ok", "again"]


def test_it_starts_a_new_chain_from_a_compacted_window(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "cobalt is the word"})
    conversation: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": "The word is cobalt."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "OK."}]},
    ]
    compacted = client.responses.compact(model="sim", input=conversation)
    base: list[Any] = [
        item.model_dump(exclude_none=True, warnings=False) for item in compacted.output
    ]
    with client.responses.connect() as connection:
        connection.response.create(
            model="sim",
            store=False,
            input=[*base, {"type": "message", "role": "user", "content": "The word?"}],
        )
        answered = until_done(connection)
    assert final(answered)["status"] == "completed"
    assert engine_saw(sim) == [
        "The word is cobalt.",
        "Summary of the conversation so far:\ncobalt is the word",
        "The word?",
    ]


def test_it_runs_one_response_at_a_time_on_a_lane_and_lanes_side_by_side(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "a b c d e f", "tokens_per_second": 20})
    with client.responses.connect() as connection:
        connection.response.create(model="sim", input="one")
        connection.response.create(model="sim", input="two")  # the same lane, still busy
        connection.response.create(model="sim", input="other", stream_id="side")
        events: list[dict[str, Any]] = []
        while sum(e["type"] in ("response.completed", "error") for e in events) < 3:
            events.append(next_event(connection))
    busy = [e for e in events if e["type"] == "error"]
    assert [(e["status"], e["error"]["code"]) for e in busy] == [
        (409, "response_already_in_flight")
    ]
    side = [e for e in events if e.get("stream_id") == "side"]
    main = [e for e in events if "stream_id" not in e and e["type"] != "error"]
    assert text_of(side) == text_of(main) == "a b c d e f"
    # Each lane numbers its own events; the two were interleaved on the socket.
    assert [e["sequence_number"] for e in side] == list(range(len(side)))
    assert [e["sequence_number"] for e in main] == list(range(len(main)))
    order = [e.get("stream_id") for e in events if e["type"] == "response.output_text.delta"]
    assert order != sorted(order, key=str)


def test_it_cancels_the_engine_request_when_the_socket_closes_mid_response(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "word " * 200, "tokens_per_second": 20})
    with client.responses.connect() as connection:
        connection.response.create(model="sim", input="talk")
        while next_event(connection)["type"] != "response.output_text.delta":
            pass
    wait_until(lambda: cancellations(sim) == 1, 10)


def test_it_refuses_the_handshake_without_a_valid_key(
    gateway_url: str, api_key: Callable[..., str], site: Any
) -> None:
    url = gateway_url.replace("http://", "ws://") + "/v1/responses"
    with pytest.raises(websockets.InvalidStatus) as no_key:
        connect(url)
    with pytest.raises(websockets.InvalidStatus) as bad_key:
        connect(url, additional_headers={"authorization": "Bearer msk-nope-nope"})
    for refused in (no_key.value, bad_key.value):
        assert refused.response.status_code == 401
        assert json.loads(refused.response.body or b"")["error"]["code"] == "invalid_api_key"
    key = api_key()
    with pytest.raises(websockets.InvalidStatus) as elsewhere:
        connect(url.replace("/responses", "/chat"), additional_headers={"x-api-key": key})
    assert elsewhere.value.response.status_code == 404
    # A page of another origin cannot use the caller's key; a listed origin can.
    with pytest.raises(websockets.InvalidStatus) as foreign:
        connect(url, additional_headers={"x-api-key": key}, origin="https://evil.example")  # type: ignore[arg-type]
    assert foreign.value.response.status_code == 403
    site.MSHIP_CORS_ORIGINS = ["https://app.example"]
    connect(url, additional_headers={"x-api-key": key}, origin="https://app.example").close()  # type: ignore[arg-type]
    # The SDK raises as well.
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key="msk-nope-nope", max_retries=0)
    with pytest.raises(websockets.InvalidStatus), sdk.responses.connect():
        pass


def test_it_checks_each_create_as_a_request(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "ok"})
    serving("other", config={"reply": "ok"})
    limited = conforming_sdk(gateway_url, api_key("limited", allowed_models=["sim"]))
    with limited.responses.connect() as connection:
        connection.response.create(model="other", input="x")
        [hidden] = until_done(connection)
        connection.response.create(model="sim", input="x")
        assert final(until_done(connection))["status"] == "completed"
        key = ApiKey.objects.get(name="limited")
        key.revoked = True
        key.save()
        seen_by_gateway(lambda s: s.keys[key.prefix].revoked)
        connection.response.create(model="sim", input="x")
        [revoked] = until_done(connection)
    assert (hidden["status"], hidden["error"]["code"]) == (404, "model_not_found")
    assert (revoked["status"], revoked["error"]["code"]) == (401, "invalid_api_key")


def test_it_keeps_a_socket_open_past_the_header_deadline(
    client: openai.OpenAI, serving: Callable[..., Deployment], site: Any
) -> None:
    serving("sim", config={"reply": "later"})
    site.MSHIP_HEADER_TIMEOUT_S = 0.2
    with client.responses.connect() as connection:
        time.sleep(0.6)  # what passes is the point: three header deadlines
        connection.response.create(model="sim", input="x")
        assert text_of(until_done(connection)) == "later"


def test_it_starts_an_on_demand_model_for_a_socket(
    client: openai.OpenAI, make_deployment: Any, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    make_deployment(
        "lazy", mode="on_demand", idle_timeout_s=60, config={"reply": "awake", "startup_delay_s": 1}
    )
    seen_by_gateway(lambda s: "lazy" in s.routes)
    with client.responses.connect() as connection:
        connection.response.create(model="lazy", input="wake up")
        assert text_of(until_done(connection)) == "awake"


def test_it_answers_an_unexpected_failure_with_an_error_event_and_stays_open(
    client: openai.OpenAI, serving: Callable[..., Deployment], monkeypatch: pytest.MonkeyPatch
) -> None:
    serving("sim", config={"reply": "back"})
    real_run = websocket.run  # type: ignore[attr-defined]  # the name the module calls

    async def broken(*args: Any) -> None:
        raise RuntimeError("a bug")

    with client.responses.connect() as connection:
        monkeypatch.setattr(websocket, "run", broken)
        connection.response.create(model="sim", input="x")
        [failed] = until_done(connection)
        monkeypatch.setattr(websocket, "run", real_run)
        connection.response.create(model="sim", input="x")
        assert text_of(until_done(connection)) == "back"
    assert (failed["status"], failed["error"]["code"]) == (500, "internal_error")
    assert "a bug" not in failed["error"]["message"]  # the details stay in the log


def test_it_counts_each_response_on_a_socket_as_a_request_with_its_usage(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "one two three"})
    with client.responses.connect() as connection:
        for _ in range(2):
            connection.response.create(model="sim", input="count me")
            usage = final(until_done(connection))["usage"]

    def usage_now() -> dict[str, Any]:
        ledger.flush()
        return UsageMinute.objects.filter(deployment="sim").aggregate(
            requests=Sum("requests"), tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out")
        )

    # A response's record closes just after its last event reaches the client.
    wait_until(lambda: usage_now()["requests"] == 2, 10)
    used = usage_now()
    assert used == {
        "requests": 2,
        "tokens_in": 2 * usage["input_tokens"],
        "tokens_out": 2 * usage["output_tokens"],
    }


def test_it_keeps_a_sockets_chain_on_one_replica(
    client: openai.OpenAI,
    serving: Callable[..., Deployment],
    access_lines: list[dict[str, Any]],
) -> None:
    trio = serving("trio", num_replicas=3, config={"reply": "ok"})
    with client.responses.connect() as connection:
        previous = None
        for said in ("first", "second", "third", "fourth"):
            connection.response.create(model="trio", input=said, previous_response_id=previous)
            previous = final(until_done(connection))["id"]
    served = [httpx.get(url + "/sim/stats").json()["served"] for url in trio.engine_urls]
    assert sorted(served) == [0, 0, 4]
    wait_until(lambda: len([line for line in access_lines if line.get("routed_by")]) == 4)
    assert [line["routed_by"] for line in access_lines if line.get("routed_by")] == [
        "prefix",
        *["affinity"] * 3,
    ]
