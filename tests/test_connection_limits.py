"""What a hostile connection cannot do to the server `serve` runs: hold it with headers that
never end or a body that stalls, or grow it with a body of a gigabyte."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments import deployer
from modelship_site.management.commands.serve import Command
from tests.conftest import REPO, answers, resident_bytes, wait_until
from tests.server_support import answer_of, connect, served_in_process

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Iterator


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> bool:
    """Whether the server closes the connection while the client trickles bytes."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(trickle)
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def test_it_closes_a_connection_whose_headers_never_end(gateway_url: str, site: Any) -> None:
    site.MSHIP_HEADER_TIMEOUT_S = 1.0
    with connect(gateway_url) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        assert closed_within(sock, 5, trickle=b"X-Slow: 1\r\n")  # slowloris, one line a beat
    with connect(gateway_url) as idle:
        assert closed_within(idle, 5)  # a connection that says nothing at all


def test_it_answers_408_to_a_body_that_stalls(
    gateway_url: str, api_key: Callable[..., str], site: Any
) -> None:
    site.MSHIP_BODY_IDLE_TIMEOUT_S = 0.5
    key = api_key()
    with connect(gateway_url) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"model": "x", '
        )
        answer = answer_of(sock)
    assert answer.startswith("HTTP/1.1 408") and "request_timeout" in answer


def test_it_lets_a_pipelined_request_run_past_the_header_deadline(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Any], site: Any
) -> None:
    """A request a client pipelined behind another is under way once the first is answered:
    the headers' deadline does not close its connection while its stream runs."""
    site.MSHIP_HEADER_TIMEOUT_S = 1.0
    serving("slowtalker", config={"reply": "one two three four five six", "tokens_per_second": 2})
    key = api_key()
    chat = {"model": "slowtalker", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body = json.dumps(chat).encode()
    first = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    second = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    received = b""
    began = time.monotonic()
    with connect(gateway_url) as sock:
        sock.sendall(first.encode() + second.encode() + body)  # both at once: pipelined
        sock.settimeout(20)
        while b"data: [DONE]" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break  # closed under it
            received += chunk
    assert time.monotonic() - began > 2  # the stream outlived the headers' deadline
    assert received.count(b"HTTP/1.1 200") == 2, received[-300:]
    assert b"data: [DONE]" in received and b'"six"' in received.replace(b" ", b"")


@pytest.fixture(scope="module")
def server_process(django_db_setup: None, django_db_blocker: Any) -> Iterator[tuple[str, int]]:
    """The server as `make run` starts it, in a process of its own (its memory is its own),
    with a small connection cap."""
    with served_in_process(
        django_db_blocker, MSHIP_HEADER_TIMEOUT_S="10", MSHIP_MAX_CONNECTIONS="8"
    ) as served:
        yield served


def stream_upload(url: str, total: int, headers: dict[str, str]) -> tuple[int, str]:
    """Send `total` bytes chunked as fast as the server takes them; (bytes sent, answer)."""
    chunk = b"x" * (1 << 20)
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sent = 0
    with connect(url) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            + b"Content-Type: application/json\r\n"
            + head.encode()
            + b"\r\n"
        )
        try:
            while sent < total:
                sock.sendall(frame)
                sent += len(chunk)
        except OSError:
            pass  # the server answered and closed: the rest is not read
        answer = answer_of(sock)
    return sent, answer


@pytest.mark.parametrize("authorised", [False, True])
def test_it_holds_the_body_limit_against_a_gigabyte_upload(
    server_process: tuple[str, int], api_key: Callable[..., str], authorised: bool
) -> None:
    url, pid = server_process
    headers = {"authorization": f"Bearer {api_key()}"} if authorised else {}
    expected = 401 if not authorised else 200
    wait_until(lambda: httpx.get(url + "/v1/models", headers=headers).status_code == expected)
    idle = resident_bytes(pid) // 1024
    peak = [idle]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(resident_bytes(pid) // 1024)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        sent, answer = stream_upload(url, 2**30, headers)
    finally:
        done.set()
        sampler.join()
    status = "413" if authorised else "401"
    assert answer.startswith(f"HTTP/1.1 {status}"), answer[:200]
    assert "connection: close" in answer.lower()
    assert sent < 2**30  # the server closed instead of reading the rest
    grown_mib = (max(peak) - idle) / 1024
    print(f"RSS idle {idle / 1024:.1f} MiB, grown by {grown_mib:.1f} MiB, sent {sent >> 20} MiB")
    assert grown_mib < 64
    assert answers(url + "/health")  # and it still serves


def test_it_refuses_connections_past_the_cap(server_process: tuple[str, int]) -> None:
    url, _ = server_process
    held = [connect(url) for _ in range(8)]  # idle connections, up to the cap
    try:
        with connect(url) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            extra.settimeout(10)
            assert extra.recv(65536).startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: httpx.get(url + "/health").status_code == 200)


@pytest.mark.usefixtures("engines")
def test_it_slows_the_engine_for_a_slow_reader_instead_of_buffering(
    server_process: tuple[str, int], api_key: Callable[..., str], make_deployment: Any
) -> None:
    """A client that stops reading a 60 MB stream: the server's memory stays flat (the
    engine waits), and every byte still arrives once the client reads again."""
    url, pid = server_process
    word = "x" * 20_000
    sim = make_deployment("big", config={"reply": word, "tokens_per_second": 0})
    deployer.restart(sim.pk)
    headers = {"authorization": f"Bearer {api_key()}"}
    body = {"model": "big", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3000}
    wait_until(
        lambda: (
            httpx.post(
                url + "/v1/chat/completions", json={**body, "max_tokens": 1}, headers=headers
            ).status_code
            == 200
        )
    )
    idle = resident_bytes(pid) // 1024
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers
    ) as answer:
        chunks = answer.iter_bytes()
        received = len(next(chunks))
        peak = idle
        for _ in range(30):  # three seconds of not reading
            time.sleep(0.1)
            peak = max(peak, resident_bytes(pid) // 1024)
        for chunk in chunks:
            received += len(chunk)
    grown_mib = (peak - idle) / 1024
    print(f"slow reader: RSS grown by {grown_mib:.1f} MiB, {received >> 20} MiB delivered")
    assert received > 3000 * len(word)  # all of it, in the end
    assert grown_mib < 32  # not the 60 MB the engine had to say


def test_it_is_the_server_serve_runs_by_default() -> None:
    parser = Command().create_parser("manage.py", "serve")
    assert parser.parse_args([]).server == "uvicorn"
    assert os.path.exists(REPO / "modelship_site" / "server.py")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_it_serves_on_the_event_loop_the_setting_names(
    django_db_setup: None, django_db_blocker: Any, loop: str
) -> None:
    with served_in_process(django_db_blocker, MSHIP_SERVE_LOOP=loop) as (url, pid):
        with connect(url) as sock:  # a refusal's head and body, whole, on either loop
            sock.sendall(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n")
            answer = answer_of(sock)
        on_uvloop = "/uvloop/" in (Path("/proc") / str(pid) / "maps").read_text()
    assert on_uvloop == (loop == "uvloop")
    assert answer.startswith("HTTP/1.1 413 ") and answer.endswith("takes no request body.\n")


@pytest.mark.parametrize(("size", "status"), [(60_000, 401), (70_000, 400), (4_000_000, 400)])
def test_it_refuses_request_headers_over_64_kib(
    gateway_url: str, transactional_db: None, size: int, status: int
) -> None:
    """Under either HTTP parser uvicorn picks (httptools, else h11): headers far over the
    limit are refused and the connection closed; under it, the request goes on (here, to
    its 401). (h11 holds at most 64 KiB of an unfinished header block; httptools counts
    every header.)"""
    with connect(gateway_url) as sock:
        with contextlib.suppress(OSError):  # closed while the rest was still going out
            sock.sendall(
                b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
            )
        answer = answer_of(sock)
    assert answer.startswith(f"HTTP/1.1 {status} ")
