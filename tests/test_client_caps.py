"""One client address cannot take every connection slot: past
MSHIP_MAX_CONNECTIONS_PER_CLIENT its requests are refused while another address is served.
Real sockets from two loopback addresses against the server `serve` runs."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest

from modelship_site.admission import ClientCounts
from tests.conftest import wait_until
from tests.server_support import answer_of, connect

if TYPE_CHECKING:
    import socket
    from collections.abc import Iterator

pytestmark = pytest.mark.usefixtures("transactional_db")

CROWD = "127.0.0.5"  # one client (an address no other test uses)
OTHER = "127.0.0.2"  # another


def ask(sock: socket.socket, path: str, *lines: str) -> str:
    request = [f"GET {path} HTTP/1.1", "Host: localhost", *lines, "", ""]
    sock.sendall("\r\n".join(request).encode())
    return answer_of(sock)


def served_from(url: str, source: str) -> bool:
    with connect(url, source) as sock:
        return ask(sock, "/health").startswith("HTTP/1.1 200 ")


def open_from(address: str) -> int:
    """The connections the in-process server counts from `address`."""
    return sum(
        client.connections
        for counts in list(ClientCounts._of.values())
        if (client := counts.clients.get(address)) is not None
    )


@pytest.fixture
def crowd(gateway_url: str, site: Any) -> Iterator[list[socket.socket]]:
    """Three connections from CROWD, the cap, each known to the server (it answered)."""
    site.MSHIP_MAX_CONNECTIONS_PER_CLIENT = 3
    held = [connect(gateway_url, CROWD) for _ in range(3)]
    for sock in held:
        assert ask(sock, "/health").startswith("HTTP/1.1 200 ")
    yield held
    for sock in held:
        sock.close()
    wait_until(lambda: open_from(CROWD) == 0, 10)  # the next test starts from none


def test_it_refuses_the_connection_past_the_cap_and_serves_another_address(
    gateway_url: str, crowd: list[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, "modelship_site.admission"),
        connect(gateway_url, CROWD) as fourth,
    ):
        answer = ask(fourth, "/v1/models")
        assert answer_of(fourth) == ""  # closed: the slot is not kept
    head, body = answer.split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 503 "), answer[:200]
    assert "retry-after: 5" in head.lower()
    assert json.loads(body) == {
        "error": {
            "message": "Too many connections from your address at once; retry later.",
            "type": "server_error",
            "code": "too_many_connections",
        }
    }
    assert any(CROWD in r.getMessage() for r in caplog.records), caplog.text
    with connect(gateway_url, OTHER) as other:  # another address is served meanwhile
        assert ask(other, "/v1/models").startswith("HTTP/1.1 401 ")  # (it has no key)
    assert ask(crowd[0], "/health").startswith("HTTP/1.1 200 ")  # and the first three still are


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/health", "text/plain"), ("/api/deployments/", "application/json")],
)
def test_it_answers_the_refusal_in_each_path_s_own_shape(
    gateway_url: str, crowd: list[socket.socket], path: str, shape: str
) -> None:
    with connect(gateway_url, CROWD) as fourth:
        answer = ask(fourth, path)
    assert answer.startswith("HTTP/1.1 503 "), answer[:200]
    assert f"content-type: {shape}" in answer.lower()


def test_it_serves_the_address_again_once_it_closes_a_connection(
    gateway_url: str, crowd: list[socket.socket]
) -> None:
    assert not served_from(gateway_url, CROWD)
    crowd.pop().close()
    wait_until(lambda: served_from(gateway_url, CROWD), 10)  # the server sees the close


def test_it_counts_websockets_against_the_cap(gateway_url: str, crowd: list[socket.socket]) -> None:
    with connect(gateway_url, CROWD) as fourth:
        answer = ask(
            fourth,
            "/v1/responses",
            "Upgrade: websocket",
            "Connection: Upgrade",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13",
        )
    assert answer.startswith("HTTP/1.1 503 "), answer[:200]


def test_it_has_no_cap_at_zero(gateway_url: str, crowd: list[socket.socket], site: Any) -> None:
    site.MSHIP_MAX_CONNECTIONS_PER_CLIENT = 0
    assert served_from(gateway_url, CROWD)
