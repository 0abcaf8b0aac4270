"""The engines Modelship ships answer a request they cannot read with a 400 JSON error: an
unknown charset, `prompt: null`, a number where text belongs, a form that is not one. Never
aiohttp's plain-text 500 (which the gateway would pass on to the client as it is).

Each engine runs as its real server, in its own process, as the process runtime starts it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments.runtimes.process import free_port
from tests.conftest import REPO, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

ENGINES = {
    "simulated": ["deployments.engines.simulated", "--model", "simulated"],
    "tts": [
        "deployments.engines.tts_server",
        "--model",
        "espeak-ng",
        "--config",
        json.dumps({"backend": "espeak"}),
    ],
}
JSON = "application/json"
FORM = "multipart/form-data; boundary=x"
# (content type, body): what a client sent that no engine can read, on any path.
UNREADABLE = [
    ("application/json; charset=no-such-codec", b'{"model": "m"}'),
    ("application/json; charset=utf-8", b'{"model": "\xff\xfe"}'),
    ("application/x-www-form-urlencoded; charset=no-such-codec", b"model=m"),
    (JSON, b"[1, 2]"),
    ("multipart/form-data", b"no boundary"),
    (
        FORM,
        b'--x\r\nContent-Disposition: form-data; name="model"\r\n'
        b"Content-Type: text/plain; charset=no-such-codec\r\n\r\nm\r\n--x--\r\n",
    ),
]
# (path, JSON body): a field of the wrong type, or null where a value is required.
WRONG_FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": None}),
    ("/v1/embeddings", {"input": None}),
    ("/v1/chat/completions", {"messages": None}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    ("/v1/audio/speech", {"input": 5, "voice": 3}),
    ("/v1/audio/speech", {"input": "hi", "speed": "fast"}),
    ("/v1/audio/speech", {"input": None}),
]
PATHS = {
    "simulated": [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/responses",
        "/v1/audio/transcriptions",
        "/tokenize",
    ],
    "tts": ["/v1/audio/speech"],
}


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(its family, its URL): the engine's real server."""
    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", *ENGINES[request.param], "--port", str(port)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up)
        yield request.param, url
    finally:
        process.terminate()
        process.wait()


@pytest.mark.parametrize(("content_type", "body"), UNREADABLE)
def test_it_answers_a_request_it_cannot_read_with_a_400_json_error(
    engine: tuple[str, str], content_type: str, body: bytes
) -> None:
    family, url = engine
    for path in PATHS[family]:
        answer = httpx.post(url + path, content=body, headers={"content-type": content_type})
        assert answer.status_code == 400, (path, answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith(JSON), (path, answer.text)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"], (path, error)


def test_it_answers_a_field_of_the_wrong_type_with_a_400_json_error(
    engine: tuple[str, str],
) -> None:
    family, url = engine
    for path, body in WRONG_FIELDS:
        if path not in PATHS[family]:
            continue
        answer = httpx.post(url + path, json={"model": "m", **body})
        assert answer.status_code == 400, (path, body, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request_error"


def test_it_names_the_field_that_is_null(engine: tuple[str, str]) -> None:
    family, url = engine
    if family != "simulated":
        pytest.skip("the fields of the OpenAI text endpoints")
    for path, field in [("/v1/completions", "prompt"), ("/v1/embeddings", "input")]:
        answer = httpx.post(url + path, json={"model": "simulated", field: None})
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == f"'{field}' is required."


def test_it_answers_unknown_routes_and_methods_in_json(engine: tuple[str, str]) -> None:
    _, url = engine
    missing = httpx.post(url + "/v1/no-such-route", json={})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong_method = httpx.delete(url + "/v1/models")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert "GET" in wrong_method.headers["allow"]
