"""The Responses WebSocket's bounds: lanes per socket (MSHIP_WS_MAX_LANES) and lanes against
the server's connection cap, the contexts it remembers bounded in bytes, each message's JSON
read with the depth limit of a request body; and a fuzz of the socket with random, deep and
huge messages: every message is answered with an `error` event or the socket closes cleanly,
never a server error."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from deployments import deployer
from openai_api import ws_lanes
from openai_api.models import ApiKey
from tests.conftest import wait_until
from tests.open_responses_schema import conforming_sdk
from tests.server_support import served_in_process
from tests.ws_support import next_event, text_of, until_done

if TYPE_CHECKING:
    from collections.abc import Callable

    import openai

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")

SLOW = {"reply": "word " * 40, "tokens_per_second": 20}


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return conforming_sdk(gateway_url, api_key())


def first_delta_or_error(connection: Any, lane: str) -> dict[str, Any]:
    """The lane's first text delta (it runs) or its error event (it was refused)."""
    while True:
        event = next_event(connection)
        if event.get("stream_id") == lane and event["type"] in (
            "response.output_text.delta",
            "error",
        ):
            return event


def test_it_runs_at_most_ws_max_lanes_responses_on_a_socket(
    client: openai.OpenAI, serving: Callable[..., Deployment], site: Any
) -> None:
    serving("sim", config=SLOW)
    site.MSHIP_WS_MAX_LANES = 2
    with client.responses.connect() as connection:
        for lane in ("a", "b"):
            connection.response.create(model="sim", input="x", stream_id=lane)
            assert first_delta_or_error(connection, lane)["type"] == "response.output_text.delta"
        connection.response.create(model="sim", input="x", stream_id="c")
        refused = first_delta_or_error(connection, "c")
        assert (refused["status"], refused["error"]["code"]) == (429, "too_many_streams")
        assert ws_lanes.extra() == 1  # the second lane counts as a connection of its own
        done: set[str] = set()
        while not done:  # a lane ends: its room is free again
            event = next_event(connection)
            if event["type"] == "response.completed":
                done.add(event["stream_id"])
        connection.response.create(model="sim", input="x", stream_id="c")
        assert first_delta_or_error(connection, "c")["type"] == "response.output_text.delta"
    # The socket gone, nothing is counted for it (once the server has seen the close: its
    # lanes end on their own tasks).
    wait_until(lambda: ws_lanes.extra() == 0, timeout=10)


def test_it_counts_lanes_against_the_servers_connection_cap(
    client: openai.OpenAI, serving: Callable[..., Deployment], site: Any
) -> None:
    serving("sim", config=SLOW)
    site.MSHIP_MAX_CONNECTIONS = 2  # this socket, and one lane beyond its first
    with client.responses.connect() as connection:
        for lane in ("a", "b"):
            connection.response.create(model="sim", input="x", stream_id=lane)
            assert first_delta_or_error(connection, lane)["type"] == "response.output_text.delta"
        connection.response.create(model="sim", input="x", stream_id="c")
        refused = first_delta_or_error(connection, "c")
        assert (refused["status"], refused["error"]["code"]) == (503, "server_busy")


def test_it_forgets_the_oldest_contexts_past_the_byte_bound(
    client: openai.OpenAI, serving: Callable[..., Deployment], site: Any
) -> None:
    serving("sim", config={"reply": "ok"})
    site.MSHIP_WS_CONTEXT_BYTES = 5000  # about two of the contexts below
    ids = []
    with client.responses.connect() as connection:
        for n in range(3):
            connection.response.create(model="sim", input=f"{n}" * 2000, store=False)
            ids.append(until_done(connection)[-1]["response"]["id"])
        connection.response.create(model="sim", input="again", previous_response_id=ids[0])
        [forgotten] = until_done(connection)
        connection.response.create(model="sim", input="again", previous_response_id=ids[2])
        continued = until_done(connection)
    assert (forgotten["status"], forgotten["error"]["code"]) == (400, "previous_response_not_found")
    assert text_of(continued) == "ok"


def test_it_reads_each_message_with_the_body_depth_limit(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "still here"})
    deep = '{"type": "response.create", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with client.responses.connect() as connection:
        connection._connection.send(deep)  # the SDK's socket, raw
        [refused] = until_done(connection)
        connection.response.create(model="sim", input="x")
        answered = until_done(connection)
    assert (refused["status"], refused["error"]["code"]) == (400, "invalid_json")
    assert "deeper than 64" in refused["error"]["message"]
    assert text_of(answered) == "still here"


# --- fuzz -----------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("MSHIP_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("MSHIP_FUZZ_SEED") != "random",
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    ["model", "input", "stream_id", "previous_response_id", "generate", "background",
     "tools", "max_output_tokens", "metadata", "instructions", "store", "text"]
)  # fmt: skip
CREATES = st.builds(
    lambda fields, model: {"type": "response.create", "model": model, **fields},
    st.dictionaries(FIELDS, JSON_VALUES, max_size=4),
    st.sampled_from(["nope", "sim-missing", ""]) | JSON_VALUES,
)


@st.composite
def deep(draw: st.DrawFn) -> str:
    depth = draw(st.integers(min_value=60, max_value=50_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    closed = draw(st.booleans())
    return opener * depth + "1" + (closer * depth if closed else "")


MESSAGES = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    JSON_VALUES.map(json.dumps),
    CREATES.map(json.dumps),
    deep(),
    st.integers(min_value=1, max_value=2_000_000).map(lambda n: '"' + "\\" * n),
    st.integers(min_value=1, max_value=200_000).map(
        lambda n: '{"type": "response.create", "input": "' + "x" * n + '"}'
    ),
)


def open_socket(gateway_url: str, key: str) -> ClientConnection:
    url = gateway_url.replace("http", "ws", 1) + "/v1/responses"
    return connect(url, additional_headers={"authorization": f"Bearer {key}"}, max_size=None)


@FUZZ
@given(messages=st.lists(MESSAGES, min_size=1, max_size=3))
def test_it_answers_any_message_with_an_error_event_or_a_clean_close(
    gateway_url: str, api_key: Callable[..., str], messages: list[str | bytes]
) -> None:
    key = api_key()
    with open_socket(gateway_url, key) as socket:
        for message in messages:
            try:
                socket.send(message)
                event = json.loads(socket.recv(timeout=30))
            except websockets.ConnectionClosed as closed:
                # A clean close only: never 1011 (the server's error).
                assert closed.rcvd is not None and closed.rcvd.code in (1000, 1007, 1009), closed
                return
            assert event["type"] == "error", event
            assert 400 <= event["status"] < 500, event
            assert event["error"]["type"] in ("invalid_request_error", "not_found_error"), event


def test_it_closes_cleanly_on_a_message_over_the_body_limit(
    gateway_url: str, api_key: Callable[..., str]
) -> None:
    with open_socket(gateway_url, api_key()) as socket:
        socket.send("x" * (16 * 2**20 + 1))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            socket.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_it_refuses_http_requests_while_a_sockets_lanes_fill_the_server(
    make_deployment: Any, django_db_blocker: Any
) -> None:
    sim = make_deployment("sim", config=SLOW)
    deployer.restart(sim.pk)
    _, key = ApiKey.issue("lanes")
    auth = {"authorization": f"Bearer {key}"}
    # Three connections: the socket, its second lane, and one more.
    with served_in_process(django_db_blocker, MSHIP_MAX_CONNECTIONS="3") as (url, _):
        assert httpx.get(url + "/v1/models", headers=auth).status_code == 200
        with open_socket(url, key) as socket:
            for lane in ("a", "b"):
                socket.send(json.dumps({"type": "response.create", "model": "sim",
                                        "input": "x", "stream_id": lane}))  # fmt: skip
            running: set[str] = set()
            while running != {"a", "b"}:
                event = json.loads(socket.recv(timeout=30))
                if event["type"] == "response.output_text.delta":
                    running.add(event["stream_id"])
            refused = httpx.get(url + "/v1/models", headers=auth)
            assert refused.status_code == 503
            done: set[str] = set()
            while done != {"a", "b"}:
                event = json.loads(socket.recv(timeout=30))
                if event["type"] == "response.completed":
                    done.add(event["stream_id"])
            assert httpx.get(url + "/v1/models", headers=auth).status_code == 200
