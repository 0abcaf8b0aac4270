"""An engine that closes a kept-alive connection as the gateway reuses it (llama.cpp's server
drops idle ones) costs the caller nothing: the request goes again on a new connection. An
engine that drops every request is still a 502."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")
ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
}


class DroppingEngine:
    """Answers each connection's first request and drops the connection at its second,
    unanswered (`always`: drops every request)."""

    def __init__(self, always: bool = False, after_s: float = 0.0, reset: bool = False) -> None:
        self.always = always
        self.after_s = after_s  # how long it holds a request it drops
        self.reset = reset  # drops it with a reset as its head arrives, its body unread
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            for served in range(2):
                length = 0
                while (line := reader.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if not line:
                    return
                if self.reset and (served == 1 or self.always):
                    # An RST, not a FIN: the gateway's write of the rest of the body fails.
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                reader.read(length)
                if served == 1 or self.always:
                    time.sleep(self.after_s)
                    return  # dropped, unanswered
                body = json.dumps(ANSWER).encode()
                head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                conn.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)


def test_it_sends_a_request_again_when_the_engine_drops_a_reused_connection(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    engine, dead = DroppingEngine(), DroppingEngine(always=True)
    make_deployment("dropping", state="ready", engine_urls=[engine.url])
    make_deployment("dead", state="ready", engine_urls=[dead.url])
    seen_by_gateway(lambda s: "dropping" in s.routes and "dead" in s.routes)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    for _ in range(3):  # each one after the first reuses the connection the engine then drops
        answer = sdk.chat.completions.create(
            model="dropping", messages=[{"role": "user", "content": "x"}]
        )
        assert answer.choices[0].message.content == "ok"
    assert engine.connections == 3
    failed = httpx.post(
        gateway_url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {api_key()}"},
        json={"model": "dead", "messages": [{"role": "user", "content": "x"}]},
    )
    assert (failed.status_code, failed.json()["error"]["code"]) == (502, "upstream_error")
    assert dead.connections == 2  # tried once more, not forever
    # An engine that had the request a while before it dropped it may have worked on it: it
    # is not sent again.
    slow = DroppingEngine(always=True, after_s=0.5)
    make_deployment("slow", state="ready", engine_urls=[slow.url])
    seen_by_gateway(lambda s: "slow" in s.routes)
    failed = httpx.post(
        gateway_url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {api_key()}"},
        json={"model": "slow", "messages": [{"role": "user", "content": "x"}]},
    )
    assert (failed.status_code, slow.connections) == (502, 1)
    for each in (engine, dead, slow):
        each.listener.close()


def test_it_sends_a_body_again_when_the_engine_resets_a_reused_connection_under_it(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    engine = DroppingEngine(reset=True)
    make_deployment("resetting", state="ready", engine_urls=[engine.url])
    seen_by_gateway(lambda s: "resetting" in s.routes)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    long = "x " * 2_000_000  # 4 MB: still being written when the reset comes
    for _ in range(3):
        answer = sdk.chat.completions.create(
            model="resetting", messages=[{"role": "user", "content": long}]
        )
        assert answer.choices[0].message.content == "ok"
    assert engine.connections == 3
    engine.listener.close()
