"""The server `make run` starts, in a process of its own, and raw sockets to talk to it: for
tests of what a hostile connection can and cannot do."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from deployments.runtimes.process import free_port
from tests.conftest import REPO, answers, env_for_subprocess, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator


def connect(url: str, source: str | None = None) -> socket.socket:
    """A connection to the server at `url`, from the loopback address `source` if given."""
    parts = urlsplit(url)
    return socket.create_connection(
        (parts.hostname or "", parts.port or 80),
        timeout=10,
        source_address=(source, 0) if source else None,
    )


def answer_of(sock: socket.socket, timeout: float = 10, begun: bytes = b"") -> str:
    """What the server answers on `sock` (after `begun`, what was read of it already): its
    head and its body as far as its content-length says, or the head and what came with it
    where it gives none; "" when it closed without a word or kept silent for `timeout`
    seconds. The head and the body may come in separate segments (one write each)."""
    sock.settimeout(timeout)
    answer = begun
    with contextlib.suppress(OSError):
        while not whole(answer) and (part := sock.recv(65536)):
            answer += part
    return answer.decode(errors="replace")


def whole(answer: bytes) -> bool:
    head, ended, body = answer.partition(b"\r\n\r\n")
    if not ended:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def answer_until_closed(sock: socket.socket, timeout: float = 10) -> str:
    """Everything the server sends on `sock` until it closes the connection."""
    sock.settimeout(timeout)
    parts = []
    with contextlib.suppress(OSError):
        while part := sock.recv(65536):
            parts.append(part)
    return b"".join(parts).decode(errors="replace")


@contextlib.contextmanager
def served_in_process(django_db_blocker: Any, **env: str) -> Iterator[tuple[str, int]]:
    """The server on a port of its own, with these settings; (its URL, its process id)."""
    port = free_port("127.0.0.1")
    with django_db_blocker.unblock():
        environment = env_for_subprocess(**env)
    process = subprocess.Popen(
        [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
        cwd=REPO,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(url + "/health"), 60)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(30)
