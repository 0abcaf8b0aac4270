"""Slow or huge request bodies cannot hold connections or fill the disk, on any path: Django's
(/api, the admin, /health...) as well as the gateway's (/v1). Real sockets against the
server `serve` runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import uvicorn

from deployments.runtimes.process import free_port
from modelship_site.server import config
from openai_api.models import ApiKey
from tests.conftest import wait_until
from tests.gateway_support import PEER, OnDemandSite
from tests.server_support import answer_of, answer_until_closed, connect, served_in_process

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.usefixtures("transactional_db")


def head(method: str, path: str, *lines: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: localhost", *lines, "", ""]).encode()


def drip(sock: socket.socket, every: float = 0.1, give_up_s: float = 20) -> str:
    """Send a body one byte every `every` seconds (far faster than the idle deadline) until
    the server answers; its answer, or "" if it never did within `give_up_s`."""
    sock.settimeout(every)
    give_up = time.monotonic() + give_up_s
    while time.monotonic() < give_up:
        try:
            if answer := sock.recv(65536):
                return answer_of(sock, 5, answer)
            return ""
        except TimeoutError:
            pass
        except OSError:
            return ""
        try:
            sock.sendall(b" ")
        except OSError:
            return answer_of(sock, every)
    return ""


def body_of(answer: str) -> Any:
    return json.loads(answer.split("\r\n\r\n", 1)[1])


@pytest.fixture
def short_deadlines(site: Any) -> Any:
    site.MSHIP_BODY_IDLE_TIMEOUT_S = 0.5
    site.MSHIP_BODY_TOTAL_TIMEOUT_S = 1.0
    return site


@pytest.mark.usefixtures("short_deadlines")
def test_it_cuts_a_body_dripping_to_api_at_the_total_deadline(gateway_url: str) -> None:
    with connect(gateway_url) as sock:
        sock.sendall(
            head(
                "POST",
                "/api/deployments/",
                "Content-Type: application/json",
                "Content-Length: 1000",
            )
        )
        answer = drip(sock)
        assert answer.startswith("HTTP/1.1 408 "), answer[:200]
        assert "connection: close" in answer.lower()
        assert body_of(answer) == {"detail": "The request body was not in within 1 s."}
        assert answer_of(sock) == ""  # and the connection is closed: its slot is free


@pytest.mark.usefixtures("short_deadlines")
def test_it_cuts_a_body_dripping_to_v1_at_the_total_deadline(
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    """A key holder sending a byte well within the idle deadline is still cut off."""
    key = api_key()
    with connect(gateway_url) as sock:
        sock.sendall(
            head(
                "POST",
                "/v1/chat/completions",
                f"Authorization: Bearer {key}",
                "Content-Type: application/json",
                "Content-Length: 1000",
            )
            + b'{"model": "x", '
        )
        answer = drip(sock)
    assert answer.startswith("HTTP/1.1 408 "), answer[:200]
    assert body_of(answer) == {
        "error": {
            "message": "The request body was not in within 1 s.",
            "type": "invalid_request_error",
            "code": "request_timeout",
        }
    }


@pytest.mark.usefixtures("short_deadlines")
def test_it_answers_408_to_a_body_that_stalls_at_api(gateway_url: str, site: Any) -> None:
    site.MSHIP_BODY_TOTAL_TIMEOUT_S = 60.0  # only the idle deadline can end it
    with connect(gateway_url) as sock:
        sock.sendall(head("POST", "/api/deployments/", "Content-Length: 100") + b"{")
        answer = answer_of(sock)
    assert answer.startswith("HTTP/1.1 408 "), answer[:200]
    assert body_of(answer) == {"detail": "The request body stalled for 0.5 s."}


@pytest.mark.parametrize("path", ["/health", "/readyz", "/metrics", "/static/x.css"])
@pytest.mark.parametrize("framing", ["Content-Length: 100", "Transfer-Encoding: chunked"])
def test_it_refuses_a_body_at_once_where_a_path_takes_none(
    gateway_url: str,
    path: str,
    framing: str,
) -> None:
    """Before a byte of it arrives (a declared length), or with its first chunk."""
    with connect(gateway_url) as sock:
        sock.sendall(head("POST", path, framing))
        if framing.startswith("Transfer"):
            sock.sendall(b"1\r\nx\r\n")
        answer = answer_of(sock)
        assert answer.startswith("HTTP/1.1 413 "), answer[:200]
        assert "content-type: text/plain" in answer.lower()
        assert "connection: close" in answer.lower()
        assert answer.endswith("This path takes no request body.\n")
        assert answer_of(sock) == ""


def test_it_still_answers_those_paths_without_a_body(gateway_url: str) -> None:
    assert httpx.get(gateway_url + "/health").status_code == 200
    # An empty body is no body: Django answers (its CSRF check), not the limit.
    assert httpx.post(gateway_url + "/health", content=b"").status_code == 403


def upload(url: str, path: str, total: int, *, chunked: bool) -> tuple[int, str]:
    """Send `total` bytes to `path` as fast as the server takes them; (bytes sent, answer)."""
    piece = b"x" * (1 << 20)
    framed = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    sent = 0
    with connect(url) as sock:
        sock.sendall(head("POST", path, "Content-Type: application/json", framing))
        with contextlib.suppress(OSError):  # the server answered and closed
            while sent < total:
                sock.sendall(framed)
                sent += len(piece)
        return sent, answer_of(sock)


@pytest.mark.parametrize("chunked", [False, True])
def test_it_refuses_an_oversize_body_to_api_without_reading_it(
    gateway_url: str,
    site: Any,
    chunked: bool,
) -> None:
    site.MSHIP_MAX_DJANGO_BODY_BYTES = 64 * 1024
    total = 256 << 20
    sent, answer = upload(gateway_url, "/api/deployments/", total, chunked=chunked)
    assert answer.startswith("HTTP/1.1 413 "), answer[:200]
    assert body_of(answer) == {"detail": "The request body is larger than 65536 bytes."}
    assert sent < total  # the server closed instead of reading (and spooling) the rest
    assert httpx.get(gateway_url + "/health").status_code == 200


def test_it_hands_a_body_within_the_limit_to_the_view(
    gateway_url: str,
    django_user_model: Any,
) -> None:
    """The admin's login form, through the limits: its body arrives whole."""
    django_user_model.objects.create_superuser("admin", password="pw-for-tests")
    with httpx.Client(base_url=gateway_url) as client:
        page = client.get("/admin/login/")
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert found is not None
        form = {
            "csrfmiddlewaretoken": found.group(1),
            "username": "admin",
            "password": "pw-for-tests",
            "next": "/admin/",
            "padding": "p" * 100_000,  # several of the server's reads
        }
        answer = client.post("/admin/login/", data=form)
    assert answer.status_code == 302, answer.text[:500]
    assert answer.headers["location"] == "/admin/"


@pytest.fixture(scope="module")
def small_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[tuple[str, int]]:
    """A server with 16 connection slots, none of them kept from one client in particular."""
    with served_in_process(
        django_db_blocker, MSHIP_MAX_CONNECTIONS="16", MSHIP_MAX_CONNECTIONS_PER_CLIENT="0"
    ) as served:
        yield served


def test_it_keeps_slots_free_of_half_sent_bodies_to_health(small_server: tuple[str, int]) -> None:
    """Three times as many connections as there are slots each declare a body for /health and
    send none of it: each is refused at once and its slot freed, and /v1 is still served."""
    url, _ = small_server
    headers = {"authorization": f"Bearer {ApiKey.issue('app')[1]}"}
    wait_until(lambda: httpx.get(url + "/v1/models", headers=headers).status_code == 200)
    held = []
    try:
        for _ in range(48):  # one after another, the client keeping each open
            held.append(sock := connect(url))
            sock.sendall(head("POST", "/health", "Content-Length: 100"))
            refused = answer_until_closed(sock)
            assert refused.startswith("HTTP/1.1 413 "), refused[:200]
        served = httpx.get(url + "/v1/models", headers=headers)
        assert served.status_code == 200, served.text
    finally:
        for sock in held:
            sock.close()


def test_it_answers_past_the_total_cap_in_the_gateway_s_shape(
    small_server: tuple[str, int],
) -> None:
    """The total cap's refusal on /v1 is OpenAI-shaped, with Retry-After (uvicorn's own was
    a plain text 503), and closes the connection."""
    url, _ = small_server
    held = [connect(url) for _ in range(16)]  # idle connections, up to the cap
    try:
        with connect(url) as extra:
            extra.sendall(head("GET", "/v1/models"))
            answer = answer_until_closed(extra)  # and closed: no slot kept
    finally:
        for sock in held:
            sock.close()
    assert answer.startswith("HTTP/1.1 503 "), answer[:200]
    assert "retry-after: 5" in answer.lower()
    assert body_of(answer)["error"]["code"] == "too_many_connections"
    wait_until(lambda: httpx.get(url + "/health").status_code == 200)


@pytest.fixture
def waiting_server(site: Any) -> Iterator[str]:
    """The server `serve` runs, around an application that never reads a body: it answers
    /stream at once (a long answer), and waits until the test ends on every other path."""
    site.MSHIP_HEADER_TIMEOUT_S = 0.2
    site.MSHIP_BODY_TOTAL_TIMEOUT_S = 0.5
    release = asyncio.Event()
    loops: list[asyncio.AbstractEventLoop] = []  # the server's, once a request waits

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/stream":
            loops.append(asyncio.get_running_loop())
            await release.wait()
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(40):
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            await asyncio.sleep(0.05)  # an answer that takes two seconds
        await send({"type": "http.response.body", "body": b""})

    port = free_port("127.0.0.1")
    server = uvicorn.Server(config(app, "127.0.0.1", port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for loop in loops[:1]:
            loop.call_soon_threadsafe(release.set)
        server.should_exit = True
        thread.join(30)


def test_it_closes_a_connection_whose_application_neither_reads_nor_answers(
    waiting_server: str,
) -> None:
    """The headers' deadline is not dropped until the body is in: the body's total deadline
    (and the headers' again) later, the connection is closed, its slot freed."""
    with connect(waiting_server) as sock:
        sock.sendall(head("POST", "/wait", "Content-Length: 100"))
        sock.settimeout(10)
        assert sock.recv(1) == b""  # closed by the server (a silence would time out)


def test_it_keeps_a_connection_whose_body_is_in(waiting_server: str) -> None:
    """A request whose body came whole is never cut, however long its answer takes."""
    with connect(waiting_server) as sock:
        sock.sendall(head("POST", "/stream", "Content-Length: 3") + b"abc")
        answer = answer_until_closed(sock)
    assert answer.startswith("HTTP/1.1 200 ")
    assert answer.endswith("0\r\n\r\n")  # every chunk, to the chunked answer's end


@pytest.mark.usefixtures("short_deadlines")
def test_it_cuts_a_body_dripping_to_ondemand_at_the_total_deadline(
    ondemand_site: OnDemandSite,
) -> None:
    """LiteLLM's door has the same deadline as /v1."""
    with connect(ondemand_site.url, PEER) as sock:
        sock.sendall(
            head(
                "POST",
                "/ondemand/1/v1/chat/completions",
                f"Authorization: Bearer {ondemand_site.key}",
                "Content-Type: application/json",
                "Content-Length: 1000",
            )
        )
        answer = drip(sock)
    assert answer.startswith("HTTP/1.1 408 "), answer[:200]
    assert body_of(answer)["error"]["code"] == "request_timeout"
