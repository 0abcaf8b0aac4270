"""Property-based fuzzing of every /v1 and /ondemand route of the in-process gateway, in front
of the simulated engine: random and mutated bodies, headers, paths, queries and multipart
forms (in any charset Python has a codec for), token counts far past any limit. Whatever
comes in, the answer is JSON or SSE, never a 5xx other than 502/503/504 (and those
OpenAI-shaped), never a hang; and once it is over, nothing is left in flight.

MSHIP_FUZZ_EXAMPLES sets the examples per test (default 300, derandomized so CI sees the same
inputs every run); MSHIP_FUZZ_SEED=random draws new ones (for a long hunt).
"""

from __future__ import annotations

import encodings.aliases
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments import deployer
from deployments.models import Deployment, State
from ondemand.registry import controllers
from openai_api.bodies import FORM_CODECS
from openai_api.catalog import catalog
from openai_api.dispatch import dispatcher
from openai_api.endpoints import PUBLIC
from openai_api.forwarder import forwarder
from tests.conftest import wait_until
from tests.gateway_support import PEER, OnDemandSite, seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.usefixtures("engines")

EXAMPLES = int(os.environ.get("MSHIP_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("MSHIP_FUZZ_SEED") != "random",
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
ALLOWED_5XX = {502, 503, 504}
TIMEOUT_S = 30.0
SEEN: dict[str, int] = {"requests": 0}

V1_POST = sorted(PUBLIC)
TEMPLATES: dict[str, dict[str, Any]] = {
    "chat/completions": {"model": "sim", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "sim", "prompt": "hi", "max_tokens": 4},
    "embeddings": {"model": "emb", "input": "hi"},
    "messages": {
        "model": "sim",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "responses": {
        "model": "sim",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "max_output_tokens": 8,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": "low"},
    },
    "audio/speech": {"model": "sim", "input": "hi", "voice": "en"},
    "images/generations": {"model": "sim", "prompt": "a cat"},
    "rerank": {"model": "sim", "query": "q", "documents": ["a"]},
    "score": {"model": "sim", "text_1": "a", "text_2": "b"},
}

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
models = st.sampled_from(["sim", "emb", "od", "missing", "", "sim" * 100])
# What a request may ask an engine to make: within the deployment's limit, just past it, and
# far past it (2**31 once grew the simulated engine until the OOM killer stopped it).
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
token_counts = st.sampled_from([0, 1, 32768, 32769, 2**31, 2**63, 10**30, 1e308, -1, 2.5])


@st.composite
def mutated(draw: st.DrawFn, endpoint: str) -> dict[str, Any]:
    """A valid body of the endpoint with a few fields replaced, added or removed."""
    body = json.loads(json.dumps(TEMPLATES.get(endpoint, TEMPLATES["chat/completions"])))
    body["model"] = draw(models)
    for _ in range(draw(st.integers(0, 3))):
        keys = [*body, "stream", "stream_options", *TOKEN_FIELDS, "tools", "background", "store"]
        key = draw(st.sampled_from(keys))
        action = draw(st.sampled_from(["replace", "drop", "deepen"]))
        if action == "drop":
            body.pop(key, None)
        elif action == "deepen" and isinstance(body.get(key), list | dict):
            container = body[key]
            if isinstance(container, list) and container:
                container[draw(st.integers(0, len(container) - 1))] = draw(json_value)
            elif isinstance(container, dict) and container:
                container[draw(st.sampled_from(sorted(container)))] = draw(json_value)
        elif key in TOKEN_FIELDS:
            body[key] = draw(token_counts | json_value)
        else:
            body[key] = draw(json_value | st.booleans())
    return body


@st.composite
def form(draw: st.DrawFn) -> tuple[bytes, str]:
    boundary = draw(st.sampled_from(["b0und", "x" * 70, "a b"]))
    parts = []
    for name in draw(st.lists(st.sampled_from(["model", "file", "language", "x"]), max_size=4)):
        ctype = draw(
            st.sampled_from(
                [
                    "",
                    "text/plain; charset=utf-8",
                    "text/plain; charset=x-nope",
                    # Codecs Python has but a form is not read in (punycode and idna decode in
                    # quadratic time), and spellings of the ones it is.
                    "text/plain; charset=punycode",
                    "text/plain; charset=idna",
                    "text/plain; charset=utf-7",
                    "text/plain; charset=utf-16",
                    "text/plain; charset=rot13",
                    'text/plain; charset="UTF8"',
                    "text/plain; charset=latin1",
                    "text/plain; charset=us-ascii",
                    "multipart/mixed; boundary=c",
                    "audio/wav",
                ]
            )
        )
        value = draw(st.binary(max_size=64) | st.sampled_from([b"sim", b"emb", b"\xff\xfe"]))
        head = f'Content-Disposition: form-data; name="{name}"'
        if name == "file":
            head += '; filename="a.wav"'
        if ctype:
            head += f"\r\nContent-Type: {ctype}"
        parts.append(f"--{boundary}\r\n{head}\r\n\r\n".encode() + value + b"\r\n")
    tail = draw(st.sampled_from([f"--{boundary}--\r\n".encode(), b"", b"--"]))
    content_type = draw(
        st.sampled_from(
            [
                f"multipart/form-data; boundary={boundary}",
                f'multipart/form-data; boundary="{boundary}"',
                "multipart/form-data",
                "multipart/form-data; boundary=other",
            ]
        )
    )
    return b"".join(parts) + tail, content_type


@st.composite
def request(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    """(method, path, body, headers) for /v1."""
    kind = draw(st.sampled_from(["mutated", "json", "bytes", "form", "stored", "other"]))
    endpoint = draw(st.sampled_from(V1_POST))
    headers = {"content-type": "application/json"}
    method, path, body = "POST", f"/v1/{endpoint}", b""
    if kind == "mutated":
        body = json.dumps(draw(mutated(endpoint))).encode()
    elif kind == "json":
        body = json.dumps(draw(json_value)).encode()
    elif kind == "bytes":
        body = draw(st.binary(max_size=200) | st.sampled_from([b"[" * 5000, b'{"model": "sim"']))
        headers["content-type"] = draw(
            st.sampled_from(["application/json", "text/plain", "", "multipart/form-data"])
        )
    elif kind == "form":
        body, headers["content-type"] = draw(form())
    elif kind == "stored":
        response_id = draw(st.sampled_from(["resp_x", "", "a/b", "%00", "\u00e9"]))
        rest = draw(st.sampled_from(["", "/input_items", "/cancel", "/x/y"]))
        method = draw(st.sampled_from(["GET", "DELETE", "POST", "PUT"]))
        query = draw(
            st.sampled_from(
                [
                    "",
                    "?stream=true&starting_after=--1",
                    "?stream=true&starting_after=\u00b2",
                    "?limit=abc&order=sideways",
                    "?after=zz&limit=101",
                    "?stream=true",
                ]
            )
        )
        path = f"/v1/responses/{response_id}{rest}{query}"
    else:
        method = draw(st.sampled_from(["GET", "POST", "PATCH", "OPTIONS", "HEAD"]))
        path = draw(
            st.sampled_from(["/v1/models", "/v1/models/sim", "/v1/models/x/y", "/v1/", "/v1/nope"])
        )
        body = json.dumps(draw(json_value)).encode() if method == "POST" else b""
    for name in draw(
        st.lists(st.sampled_from(["origin", "x-request-id", "x-user-id"]), max_size=2)
    ):
        headers[name] = draw(
            st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=300)
        )
    return method, path, body, headers


def check(answer: httpx.Response) -> None:
    SEEN["requests"] += 1
    status = answer.status_code
    content_type = answer.headers.get("content-type", "")
    assert status < 500 or status in ALLOWED_5XX, (status, answer.text[:500])
    if not method_has_body(answer):
        return
    assert content_type.startswith(("application/json", "text/event-stream", "audio/")), (
        status,
        content_type,
        answer.text[:300],
    )
    if status >= 400:
        error = answer.json()["error"]
        assert error["message"] and error["code"], answer.text[:300]
    if content_type.startswith("text/event-stream"):
        ending = answer.text.rstrip()
        assert not ending or ending.endswith(("[DONE]", "}")), ending[-300:]


def method_has_body(answer: httpx.Response) -> bool:
    return answer.request.method != "HEAD" and answer.status_code not in (204, 304)


def send(
    client: httpx.Client, method: str, path: str, body: bytes, headers: dict[str, str]
) -> None:
    answer = client.request(method, path, content=body or None, headers=headers)
    try:
        check(answer)
    except Exception as exc:
        raise AssertionError(
            f"{method} {path} {headers} {body[:300]!r} -> {answer.status_code}"
            f" {answer.headers.get('content-type')} {answer.text[:300]!r}"
        ) from exc


@dataclass
class Site:
    v1: httpx.Client
    ondemand: httpx.Client
    ondemand_id: int


@pytest.fixture
def fuzz_site(
    gateway_url: str,
    api_key: Callable[..., str],
    make_deployment: Any,
    site: Any,
    ondemand_site: OnDemandSite,
) -> Iterator[Site]:
    site.MSHIP_MCP_ALLOWED_HOSTS = ["mcp.invalid"]  # no lookups of random names
    site.MSHIP_SSE_KEEPALIVE_S = 5
    deployments = [
        make_deployment("sim", config={"tokens_per_second": 0}),
        make_deployment("emb", usecase="embed"),
        # Instant, as "sim": a body asking 32,768 tokens is answered within the client's wait.
        make_deployment(
            "od", mode="on_demand", idle_timeout_s=600, config={"tokens_per_second": 0}
        ),
    ]
    for deployment in deployments:
        deployer.restart(deployment.pk)
        deployment.refresh_from_db()
        assert deployment.state == State.READY, deployment.state_reason
    seen_by_gateway(lambda s: all(s.routes[d.name].state == "ready" for d in deployments))
    key = api_key(requests_per_minute=10**6)
    with (
        httpx.Client(
            base_url=gateway_url, headers={"authorization": f"Bearer {key}"}, timeout=TIMEOUT_S
        ) as v1,
        httpx.Client(
            base_url=gateway_url,
            headers={"authorization": f"Bearer {ondemand_site.key}"},
            transport=httpx.HTTPTransport(local_address=PEER),
            timeout=TIMEOUT_S,
        ) as ondemand,
    ):
        yield Site(v1, ondemand, deployments[2].pk)
    assert_nothing_in_flight()
    print(f"fuzz: {SEEN['requests']} requests answered")


def assert_nothing_in_flight() -> None:
    """The gateway's counters are back at zero: no slot, stream or waiter was leaked."""

    def settled() -> bool:
        entries = [e for c in controllers() for e in c.entries.values()]
        return (
            not any(dispatcher.outstanding.values())
            and not forwarder.active
            and all(e.inflight == 0 and e.waiting == 0 and e.queued == 0 for e in entries)
        )

    wait_until(settled, 30)


@FUZZ
@given(case=request())
def test_it_answers_any_v1_request_in_shape(
    fuzz_site: Site, case: tuple[str, str, bytes, dict[str, str]]
) -> None:
    send(fuzz_site.v1, *case)


@FUZZ
@given(
    tail=st.sampled_from(
        [
            "chat/completions",
            "completions",
            "embeddings",
            "responses",
            "models",
            "models/od",
            "audio/transcriptions",
            "sleep",
            "collective_rpc",
            "x",
        ]
    ),
    body=st.one_of(mutated("chat/completions"), json_value),
    raw_id=st.sampled_from(["{id}", "0", "x", "%ff", "{id}/..", "{id}%2f"]),
    method=st.sampled_from(["POST", "GET", "HEAD"]),
)
def test_it_answers_any_ondemand_request_in_shape(
    fuzz_site: Site, tail: str, body: Any, raw_id: str, method: str
) -> None:
    deployment = raw_id.replace("{id}", str(fuzz_site.ondemand_id))
    path = f"/ondemand/{deployment}/v1/{tail}"
    content = json.dumps(body).encode() if method == "POST" else b""
    send(fuzz_site.ondemand, method, path, content, {"content-type": "application/json"})


@FUZZ
@given(
    endpoint=st.sampled_from(["chat/completions", "completions", "messages", "responses"]),
    field=st.sampled_from(TOKEN_FIELDS),
    count=token_counts | st.integers(min_value=32769, max_value=2**64),
    stream=st.booleans(),
)
def test_it_refuses_any_token_count_past_the_limit_in_shape(
    fuzz_site: Site, endpoint: str, field: str, count: float, stream: bool
) -> None:
    body = {**TEMPLATES[endpoint], field: count, "stream": stream}
    answer = fuzz_site.v1.post(f"/v1/{endpoint}", json=body)
    check(answer)
    if count > 32768:  # the site's default: the simulated engine names no limit of its own
        error = answer.json()["error"]
        assert (answer.status_code, error["code"], error["param"]) == (400, "invalid_value", field)


CODECS = sorted(set(encodings.aliases.aliases.values()) | {"punycode", "idna", "rot13"})


@FUZZ
@given(
    charset=st.sampled_from(CODECS) | st.text(max_size=20),
    value=st.sampled_from([b"sim", b"sim-" + b"a" * 4096, b"\xff\xfe"]),
)
def test_it_reads_a_form_only_in_the_charsets_clients_send(
    fuzz_site: Site, charset: str, value: bytes
) -> None:
    head = '--b\r\nContent-Disposition: form-data; name="model"\r\n'
    head += f'Content-Type: text/plain; charset="{charset}"\r\n\r\n'
    answer = fuzz_site.v1.post(
        "/v1/audio/transcriptions",
        content=head.encode() + value + b"\r\n--b--\r\n",
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    check(answer)
    if charset in CODECS and charset not in FORM_CODECS:  # refused unread
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_form"


@FUZZ
@given(models=st.lists(st.sampled_from(["sim", "emb", "od", "x"]), min_size=2, max_size=5))
def test_it_refuses_a_form_that_gives_its_model_more_than_once(
    fuzz_site: Site, models: list[str]
) -> None:
    parts = b"".join(
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + m.encode() + b"\r\n"
        for m in models
    )
    answer = fuzz_site.v1.post(
        "/v1/audio/transcriptions",
        content=parts + b"--b--\r\n",
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    check(answer)
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["param"]) == (400, "invalid_form", "model")


@settings(FUZZ, max_examples=min(EXAMPLES, 60))  # each one a Responses run: fewer
@given(servers=st.integers(min_value=0, max_value=40), stream=st.booleans())
def test_it_answers_any_number_of_mcp_servers_in_shape(
    fuzz_site: Site, servers: int, stream: bool
) -> None:
    tools = [
        {"type": "mcp", "server_label": f"s{n}", "server_url": f"https://mcp.invalid/{n}"}
        for n in range(servers)
    ]
    body = {**TEMPLATES["responses"], "tools": tools, "stream": stream}
    answer = fuzz_site.v1.post("/v1/responses", json=body)
    check(answer)
    if servers > 8:  # MSHIP_MCP_MAX_SERVERS: refused before any server is asked
        error = answer.json()["error"]
        assert (answer.status_code, error["param"]) == (400, "tools"), answer.text[:300]


def test_it_leaves_the_engines_as_it_found_them(fuzz_site: Site) -> None:
    """After the fuzzing above, a plain request still works end to end."""
    answer = fuzz_site.v1.post("/v1/chat/completions", json=TEMPLATES["chat/completions"])
    assert answer.status_code == 200
    assert Deployment.objects.filter(state=State.READY).count() == 3
    assert catalog.snapshot is not None
