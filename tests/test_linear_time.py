"""No request costs the gateway more than time linear in its size, and nothing runs before a
key's rate limit: the JSON depth scan, a form part's charset, a name echoed in a 404, and
the tokens a request may ask an engine to make (issue 35, item 2).

The worst cases here once took seconds to minutes (3 s for a 32 KB string of escaped quotes,
13 s for a 200 KB punycode form field) or memory without end (a request for 2**31 tokens):
each test asserts the answer, never a duration."""

from __future__ import annotations

import json
import socket
from itertools import islice
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.json_nesting import nesting_depth
from deployments.engines.sim_core import SimConfig, SimState, tokens_for
from deployments.loaders import LOADERS
from deployments.loaders.base import EngineSpec
from openai_api.bodies import form_field, json_value, too_deep
from openai_api.errors import GatewayError
from tests.conftest import as_gateway
from tests.ws_support import until_done

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

HI: list[Any] = [{"role": "user", "content": "hi"}]


def worst_case(size: int) -> bytes:
    """Enough brackets to pass the quick count, then a string of escaped quotes that never
    ends: the old scan retried its string pattern from every one of those quotes."""
    head = b'{"model": "sim", "x": [' + b"[], " * 65 + b'[]], "y": "'
    return head + b'\\"' * ((size - len(head)) // 2)


@pytest.mark.parametrize("size", [32 * 1024, 256 * 1024, 16 * 2**20])
def test_it_scans_an_unterminated_string_of_escaped_quotes_in_one_pass(size: int) -> None:
    body = worst_case(size)
    assert not too_deep(body)
    with pytest.raises(GatewayError) as refused:
        json_value(body)
    assert refused.value.code == "invalid_json" and "Unterminated string" in refused.value.message


texts = st.text(alphabet='[]{}"\\ ,:a\u00e9\u5c41', max_size=8)
values = st.recursive(
    st.none() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(value=values, limit=st.integers(0, 6), ascii_only=st.booleans())
def test_it_measures_the_depth_the_parser_nests(value: Any, limit: int, ascii_only: bool) -> None:
    """Brackets, quotes and backslashes inside strings never count; every nesting does."""
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert too_deep(body, limit) == (nesting_depth(value) > limit)


def test_it_reads_a_utf16_body_as_the_parser_does() -> None:
    """U+5C41 is the bytes 41 5C in UTF-16-LE: read as bytes, its 5C escaped the quote after
    it, and the nesting that followed passed as the inside of a string."""
    hidden = '{"model": "sim", "x": "\u5c41", "y": ' + "[" * 100 + "]" * 100 + ', "z": "end"}'
    with pytest.raises(GatewayError) as refused:
        json_value(hidden.encode("utf-16-le"))
    assert "nests deeper than 64" in refused.value.message
    assert json_value('{"model": "\u5c41"}'.encode("utf-16")) == {"model": "\u5c41"}


def form(charset: str, value: bytes) -> bytes:
    return (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n'
        + f"Content-Type: text/plain; charset={charset}\r\n\r\n".encode()
        + value
        + b"\r\n--b--\r\n"
    )


@pytest.mark.parametrize(
    ("charset", "value", "read"),
    [
        ("utf-8", "sim-\u00e9".encode(), "sim-\u00e9"),
        ("UTF8", "sim-\u00e9".encode(), "sim-\u00e9"),
        ('"utf_8"', b"sim", "sim"),
        ("us-ascii", b"sim", "sim"),
        ("ASCII", b"sim", "sim"),
        ("iso-8859-1", b"sim-\xe9", "sim-\u00e9"),
        ("ISO_8859-1", b"sim-\xe9", "sim-\u00e9"),
        ("latin1", b"sim-\xe9", "sim-\u00e9"),
    ],
)
def test_it_reads_a_form_field_in_the_charsets_clients_send(
    charset: str, value: bytes, read: str
) -> None:
    assert form_field("multipart/form-data; boundary=b", form(charset, value), "model") == read


@pytest.mark.parametrize("charset", ["punycode", "idna", "utf-7", "utf-16", "rot13", "x-nope"])
def test_it_refuses_any_other_charset_unread(charset: str) -> None:
    body = form(charset, b"sim-" + b"a" * 1_600_000)  # punycode: quadratic, once 50 s
    with pytest.raises(GatewayError) as refused:
        form_field("multipart/form-data; boundary=b", body, "model")
    assert (refused.value.status, refused.value.code) == (400, "invalid_form")
    assert refused.value.param == "model" and charset in refused.value.message


@pytest.mark.parametrize(
    ("loader", "config", "limit"),
    [
        ("llama_server", {}, 4096),  # llama-server's -c as Modelship passes it
        ("llama_server", {"n_ctx": 2048}, 2048),
        ("vllm", {"max_model_len": 16384}, 16384),
        ("vllm", {"max_model_len": "8192"}, 8192),
        ("vllm", {"max_model_len": "16k"}, 16000),  # vLLM's own spellings
        ("vllm", {"max_model_len": "128K"}, 131072),
        ("vllm", {"max_model_len": "25.6k"}, 25600),
        ("vllm", {"max_model_len": "lots"}, None),
        ("vllm", {}, None),  # the model's own: the site's default stands in
        ("simulated", {"max_output_tokens": 100}, 100),
        ("simulated", {}, None),
        ("tts", {}, None),
    ],
)
def test_it_takes_a_deployments_output_limit_from_its_engine_configuration(
    loader: str, config: dict[str, Any], limit: int | None
) -> None:
    spec = EngineSpec(name="m", model="m", config=config)
    assert LOADERS[loader].output_token_limit(spec) == limit


def test_it_makes_a_simulated_reply_as_it_is_sent() -> None:
    """A reply is counted, not built: asking for 2**31 tokens once grew the engine to 21 GB."""
    state = SimState(SimConfig(reply="one two", max_output_tokens=2**40), ["sim"])
    reply = tokens_for(state, {"max_tokens": 2**31}, "hi")
    assert len(reply) == 2**31
    assert list(islice(reply, 3)) == ["one", " two", " one"]
    capped = SimState(SimConfig(max_output_tokens=10), ["sim"])
    assert len(tokens_for(capped, {"max_tokens": 2**31}, "hi")) == 10


@pytest.fixture
def key_of(api_key: Callable[..., str]) -> Callable[..., dict[str, str]]:
    return lambda **fields: {"authorization": f"Bearer {api_key(**fields)}"}


@pytest.mark.usefixtures("engines")
def test_it_checks_the_rate_before_reading_any_body(
    gateway_url: str, key_of: Callable[..., dict[str, str]]
) -> None:
    headers = key_of(requests_per_minute=1)
    with httpx.Client(base_url=gateway_url, headers=headers, timeout=30) as client:
        assert client.post("/v1/conversations", json={}).status_code == 200
        # Over the rate: refused before the body is parsed (invalid JSON is not a 400)...
        answer = client.post("/v1/conversations", content=b"{not json")
        assert answer.status_code == 429 and answer.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(answer.headers["retry-after"]) >= 1
        for method, path in [("GET", "/v1/responses/resp_x"), ("GET", "/v1/models")]:
            assert client.request(method, path).status_code == 429, path
    # ... and before it is read: a body announced and never sent is not waited for.
    host, port = gateway_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(
            b"POST /v1/conversations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: {headers['authorization']}\r\n".encode()
            + b"Content-Length: 100\r\n\r\n"
        )
        status_line = raw.makefile("rb").readline()
    assert status_line.split()[1] == b"429"


@pytest.mark.usefixtures("engines")
@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/conversations"]
)
def test_it_answers_a_worst_case_body_at_once_on_every_json_route(
    gateway_url: str, key_of: Callable[..., dict[str, str]], path: str
) -> None:
    headers = {**key_of(), "content-type": "application/json"}
    answer = httpx.post(gateway_url + path, content=worst_case(256 * 1024), headers=headers)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"


@pytest.mark.usefixtures("engines")
def test_it_refuses_a_form_in_an_exotic_charset_and_reads_the_usual_ones(
    gateway_url: str, key_of: Callable[..., dict[str, str]], serving: Callable[..., Deployment]
) -> None:
    serving("sim")
    headers = {**key_of(), "content-type": "multipart/form-data; boundary=b"}
    url = gateway_url + "/v1/audio/transcriptions"
    refused = httpx.post(url, content=form("punycode", b"sim-" + b"a" * 1_600_000), headers=headers)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_form"
    read = httpx.post(url, content=form("UTF8", b"sim"), headers=headers)
    # The name was read: `sim` is a chat model, which serves no transcriptions.
    assert read.status_code == 404 and read.json()["error"]["code"] == "unsupported_endpoint"


@pytest.mark.usefixtures("engines")
def test_it_never_echoes_a_name_longer_than_a_deployments_name(
    gateway_url: str, key_of: Callable[..., dict[str, str]]
) -> None:
    body = {"model": "x" * 1_000_000, "messages": HI}
    answer = httpx.post(gateway_url + "/v1/chat/completions", json=body, headers=key_of())
    error = answer.json()["error"]
    assert answer.status_code == 404 and error["code"] == "model_not_found"
    assert "(1000000 characters)" in error["message"] and len(error["message"]) < 300


def test_it_refuses_more_output_tokens_than_a_deployment_makes(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    site: Any,
) -> None:
    serving("sim", config={"tokens_per_second": 0})
    serving("capped", config={"max_output_tokens": 5, "tokens_per_second": 0})
    key = api_key()
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0)
    asks: list[tuple[str, Callable[..., Any], dict[str, Any]]] = [
        ("max_tokens", sdk.chat.completions.create, {"messages": HI}),
        ("max_completion_tokens", sdk.chat.completions.create, {"messages": HI}),
        ("max_tokens", sdk.completions.create, {"prompt": "hi"}),
        ("max_output_tokens", sdk.responses.create, {"input": "hi"}),
    ]
    for field, create, fields in asks:
        with pytest.raises(openai.BadRequestError) as refused:
            create(model="sim", **fields, **{field: 2**31})
        assert (refused.value.code, refused.value.param) == ("invalid_value", field)
        assert f"{field} is too large: 2147483648." in refused.value.message
        assert "at most 32768 completion tokens" in refused.value.message  # the site's default
    claude = anthropic.Anthropic(base_url=gateway_url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="sim", max_tokens=2**31, messages=HI, timeout=30)
    # A deployment's own limit, and the most it allows is served.
    with pytest.raises(openai.BadRequestError) as over:
        sdk.chat.completions.create(model="capped", messages=HI, max_tokens=6)
    assert "at most 5 completion tokens" in over.value.message
    served = sdk.chat.completions.create(model="capped", messages=HI, max_tokens=5)
    assert served.usage is not None and served.usage.completion_tokens == 5
    site.MSHIP_MAX_OUTPUT_TOKENS = 1000  # the site's default, read per request
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="sim", messages=HI, max_tokens=1001)


def test_it_refuses_more_output_tokens_over_a_websocket(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    serving("capped", config={"max_output_tokens": 5, "tokens_per_second": 0})
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    with sdk.responses.connect() as connection:
        connection.response.create(model="capped", input="hi", max_output_tokens=6)
        [error] = until_done(connection)
    assert (error["status"], error["error"]["param"]) == (400, "max_output_tokens")


def test_it_has_the_simulated_engine_keep_its_own_cap_and_stream_as_it_makes(
    serving: Callable[..., Deployment],
) -> None:
    """Called directly, past the gateway: the engine refuses past its cap itself, and a long
    reply's first tokens leave before the rest is made."""
    sim = serving("sim", config={"tokens_per_second": 0, "max_output_tokens": 10**9})
    url = sim.engine_urls[0] + "/v1/chat/completions"
    said = {"model": "sim", "messages": HI, "max_tokens": 2 * 10**9}
    refused = httpx.post(url, json=said, auth=as_gateway)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_value"
    body = {"model": "sim", "messages": HI, "max_tokens": 10**9, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=30, auth=as_gateway) as answer:
        first = list(islice((line for line in answer.iter_lines() if line), 3))
    assert all(line.startswith("data: {") for line in first)
