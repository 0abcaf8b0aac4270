"""The Responses WebSocket's bounds: lanes per socket (MSHIP_WS_MAX_LANES), lanes against
the server's connection cap and against their address's (MSHIP_MAX_CONNECTIONS_PER_CLIENT),
the contexts it remembers bounded in bytes, each message's JSON
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
from modelship_site.admission import ClientCounts
from openai_api import ws_lanes
from openai_api.models import ApiKey
from tests.conftest import wait_until
from tests.open_responses_schema import conforming_sdk
from tests.server_support import answer_of, served_in_process
from tests.server_support import connect as connect_from
from tests.ws_support import next_event, text_of, until_done

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import openai
    from websockets.sync.connection import Connection

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


# --- lanes against their address's cap ---------------------------------------------------

CROWD = "127.0.0.6"  # one client address (no other test uses it)
OTHER = "127.0.0.7"  # another
LONG = {"reply": "word " * 400, "tokens_per_second": 20}  # 20 s a response, unless cut short


def held_by(address: str) -> int:
    """What the in-process server counts against `address`'s cap: connections and lanes."""
    return sum(
        client.held
        for counts in list(ClientCounts._of.values())
        if (client := counts.clients.get(address)) is not None
    )


def socket_from(gateway_url: str, key: str, address: str) -> ClientConnection:
    url = gateway_url.replace("http", "ws", 1) + "/v1/responses"
    return connect(
        url,
        additional_headers={"authorization": f"Bearer {key}"},
        source_address=(address, 0),  # to socket.create_connection
    )


def create(socket: Connection, lane: str, **fields: Any) -> None:
    event = {"type": "response.create", "model": "sim", "input": "x", "stream_id": lane}
    socket.send(json.dumps({**event, **fields}))


def next_on(socket: Connection, lane: str, *kinds: str) -> dict[str, Any]:
    """The lane's next event of these kinds (the other lanes' events meanwhile dropped)."""
    while True:
        event = json.loads(socket.recv(timeout=30))
        if event.get("stream_id") == lane and event["type"] in kinds:
            return event


def runs(socket: Connection, lane: str) -> dict[str, Any]:
    """The lane's first text delta (it runs) or its error event (it was refused)."""
    return next_on(socket, lane, "response.output_text.delta", "error")


def get_from(gateway_url: str, address: str, key: str) -> str:
    with connect_from(gateway_url, address) as sock:
        request = ["GET /v1/models HTTP/1.1", "Host: localhost", f"Authorization: Bearer {key}"]
        sock.sendall("\r\n".join([*request, "", ""]).encode())
        return answer_of(sock)


@pytest.fixture
def crowd_capped(site: Any) -> Iterator[Any]:
    site.MSHIP_MAX_CONNECTIONS_PER_CLIENT = 3
    yield site
    wait_until(lambda: held_by(CROWD) == 0, 10)  # the next test starts from none


def test_it_counts_a_sockets_lanes_against_its_addresses_cap(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    crowd_capped: Any,
) -> None:
    """One address with one socket: the socket and two lanes beyond its first fill its cap
    of three; its next lane, plain request and socket are refused, another address is
    served, and once the socket closes the address is served again."""
    serving("sim", config=LONG)
    key = api_key()
    with socket_from(gateway_url, key, CROWD) as socket:
        for lane in ("a", "b", "c"):
            create(socket, lane)
            assert runs(socket, lane)["type"] == "response.output_text.delta"
        assert held_by(CROWD) == 3
        create(socket, "d")
        refused = runs(socket, "d")
        assert (refused["status"], refused["error"]["code"]) == (503, "server_busy")
        assert refused["error"]["type"] == "server_error"
        assert "your address" in refused["error"]["message"]
        assert get_from(gateway_url, CROWD, key).startswith("HTTP/1.1 503 ")
        with pytest.raises(websockets.InvalidHandshake):
            socket_from(gateway_url, key, CROWD).close()
        assert get_from(gateway_url, OTHER, key).startswith("HTTP/1.1 200 ")
        assert held_by(CROWD) == 3  # the refusals took nothing
    wait_until(lambda: held_by(CROWD) == 0, 10)  # closed: its lanes are released with it
    assert get_from(gateway_url, CROWD, key).startswith("HTTP/1.1 200 ")


def test_it_frees_the_addresses_room_when_a_lane_ends(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    crowd_capped: Any,
) -> None:
    serving("sim", config=LONG)
    key = api_key()
    crowd_capped.MSHIP_MAX_CONNECTIONS_PER_CLIENT = 2  # the socket and one lane beyond
    with socket_from(gateway_url, key, CROWD) as socket:
        create(socket, "long")
        assert runs(socket, "long")["type"] == "response.output_text.delta"
        create(socket, "short", max_output_tokens=60)  # 3 s
        assert runs(socket, "short")["type"] == "response.output_text.delta"
        create(socket, "next")
        assert runs(socket, "next")["error"]["code"] == "server_busy"
        next_on(socket, "short", "response.completed", "response.incomplete")
        wait_until(lambda: held_by(CROWD) == 1, 10)
        create(socket, "next")
        assert runs(socket, "next")["type"] == "response.output_text.delta"


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
