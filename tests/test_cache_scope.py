"""No tenant learns what another sent through an engine's prefix cache (issue 58, item 5):
a request's prefix routing key and vLLM's cache salt are its tenant's (its key's team, or its
key), and a caller cannot name another tenant's salt."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.db.models import Sum

from deployments.models import Deployment, State
from openai_api.access import RequestRecord
from openai_api.auth import current_key
from openai_api.cache_figures import FigureHider
from openai_api.cache_scope import salt, tenant_of, with_cache_salt
from openai_api.catalog import Key, Route
from openai_api.models import ApiKey
from openai_api.routing.hints import hint_of
from openai_api.usage.ledger import ledger
from openai_api.usage.models import Team, UsageMinute
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway
from tests.test_concurrency import route as a_route

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

LONG = "You keep the books of a small bakery. " * 60
MESSAGE = {"role": "assistant", "content": "hi"}
JSON = "application/json"


def route(loader: str) -> Route:
    return dataclasses.replace(a_route(), loader=loader)


def key(id: int, team: int = 0) -> Key:
    return Key(id, f"k{id}", f"p{id}", "", False, frozenset(), None, team_id=team)


def salted(loader: str, caller: Key | None, **body: Any) -> dict[str, Any]:
    token = current_key.set(caller)
    try:
        return with_cache_salt(route(loader), {"messages": [], **body})
    finally:
        current_key.reset(token)


def test_it_salts_a_vllm_request_with_its_tenants_salt(settings: Any) -> None:
    settings.MSHIP_CACHE_SCOPE = "team"
    ada, grace, loner = key(1, team=5), key(2, team=5), key(3)
    assert (
        salted("vllm", ada)["cache_salt"] == salted("vllm", grace)["cache_salt"] == salt("team:5")
    )
    assert salted("vllm", loner)["cache_salt"] == salt("key:3") != salt("team:5")
    # A caller's own salt narrows its tenant's; it can never be another tenant's salt.
    forged = salted("vllm", loner, cache_salt=salt("team:5"))["cache_salt"]
    assert forged not in (salt("team:5"), salt("key:3"))
    assert len(forged) == 32 and forged.isalnum()
    settings.MSHIP_CACHE_SCOPE = "key"
    assert salted("vllm", ada)["cache_salt"] != salted("vllm", grace)["cache_salt"]
    assert tenant_of(ada) == "key:1"
    settings.MSHIP_CACHE_SCOPE = "site"  # one tenant's site: one cache
    assert "cache_salt" not in salted("vllm", ada)
    assert "cache_salt" not in salted("vllm", ada, cache_salt=7)
    assert "cache_salt" not in salted("llama_server", ada)  # it has no salt to give


def test_it_scopes_a_prefix_routing_key_to_its_tenant() -> None:
    chat = {"messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "x"}]}
    team_five = hint_of(chat, {}, "1", 1000, "team:5").prefix
    assert team_five == hint_of(chat, {}, "2", 1000, "team:5").prefix  # the team's keys meet
    assert team_five != hint_of(chat, {}, "3", 1000, "team:6").prefix
    assert hint_of(chat, {}, "1", 1000).prefix != team_five  # a shared site's key is bare


FIGURES = {
    "timings": {"cache_n": 7, "prompt_n": 2},
    "id_slot": 0,
    "usage": {
        "prompt_tokens": 9,
        "completion_tokens": 1,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 7},
    },
}


class Recorder(BaseHTTPRequestHandler):
    """A stand-in engine: every chat body it was sent; its answers carry cache figures as
    llama.cpp's do (its timings, its slot, the cached tokens of its usage)."""

    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        body = json.loads(self.rfile.read(length))
        self.bodies.append(body)
        whole = {"id": "c", "object": "chat.completion", "created": 0, "model": "v"}
        choice = {"index": 0, "message": MESSAGE, "finish_reason": "stop"}
        if body.get("stream"):
            first = {**whole, "object": "chat.completion.chunk"}
            delta = {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}
            events = [{**first, "choices": [delta]}, {**first, "choices": [], **FIGURES}]
            answer = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            answer += b"data: [DONE]\n\n"
            kind = "text/event-stream"
        else:
            answer, kind = json.dumps({**whole, "choices": [choice], **FIGURES}).encode(), JSON
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[str]:
    Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_it_sends_each_teams_requests_to_vllm_under_its_own_salt(
    gateway_url: str,
    api_key: Callable[..., str],
    make_deployment: Callable[..., Deployment],
    stand_in: str,
    site: Any,
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    made = make_deployment("v", loader="vllm", model="org/model")
    Deployment.objects.filter(pk=made.pk).update(state=State.READY, engine_urls=[stand_in])
    seen_by_gateway(lambda s: "v" in s.routes and s.routes["v"].urls == (stand_in,))
    red, blue = Team.objects.create(name="red"), Team.objects.create(name="blue")
    secrets = [api_key("r1", team=red), api_key("r2", team=red), api_key("b1", team=blue)]
    for secret in secrets:
        answer = httpx.post(
            gateway_url + "/v1/chat/completions",
            json={"model": "v", "messages": [{"role": "user", "content": LONG}], "cache_salt": "x"},
            headers={"authorization": f"Bearer {secret}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    salts = [body["cache_salt"] for body in Recorder.bodies]
    assert salts[0] == salts[1] != salts[2]
    assert "x" not in salts and all(len(s) == 32 for s in salts)
    assert ApiKey.objects.count() == 3


@pytest.fixture
def llama_like(
    stand_in: str, make_deployment: Callable[..., Deployment], site: Any
) -> Callable[[str], None]:
    def make(loader: str) -> None:
        site.MSHIP_ROUTE_REFRESH_S = 0.05
        made = make_deployment("v", loader=loader, model="m.gguf" if loader != "vllm" else "o/m")
        Deployment.objects.filter(pk=made.pk).update(state=State.READY, engine_urls=[stand_in])
        seen_by_gateway(lambda s: "v" in s.routes and s.routes["v"].urls == (stand_in,))

    return make


def figures_in(text: str) -> set[str]:
    return {name for name in ("timings", "id_slot", "cached_tokens", "cache_n") if name in text}


def test_it_takes_a_shared_caches_figures_out_of_each_answer(
    gateway_url: str, api_key: Callable[..., str], llama_like: Callable[[str], None], site: Any
) -> None:
    """llama.cpp keeps one cache for everyone: its cache figures would tell a prober what
    another tenant sent. They are the site's alone (its usage), not the caller's."""
    llama_like("llama_server")
    secret = api_key("prober")
    headers = {"authorization": f"Bearer {secret}"}
    ask = {"model": "v", "messages": [{"role": "user", "content": "guess"}]}
    whole = httpx.post(gateway_url + "/v1/chat/completions", json=ask, headers=headers)
    assert whole.status_code == 200 and figures_in(whole.text) == set(), whole.text
    assert whole.json()["usage"]["prompt_tokens"] == 9  # the rest of the usage stays
    streamed = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={**ask, "stream": True, "stream_options": {"include_usage": True}},
        headers=headers,
    )
    assert streamed.status_code == 200 and figures_in(streamed.text) == set(), streamed.text
    assert '"prompt_tokens": 9' in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
    key = ApiKey.objects.get(name="prober")
    ledger.flush()
    wait_until(lambda: usage_cached(key.pk) == 14, 10)  # 7 of each answer, for the site
    site.MSHIP_CACHE_FIGURES = "all"  # a site of one tenant: as the engine said them
    shown = httpx.post(gateway_url + "/v1/chat/completions", json=ask, headers=headers)
    assert figures_in(shown.text) == {"timings", "id_slot", "cached_tokens", "cache_n"}


def test_it_leaves_a_salted_engines_figures_to_the_tenant_whose_they_are(
    gateway_url: str, api_key: Callable[..., str], llama_like: Callable[[str], None], site: Any
) -> None:
    llama_like("vllm")
    secret = api_key("own")
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={"model": "v", "messages": [{"role": "user", "content": "mine"}]},
        headers={"authorization": f"Bearer {secret}"},
    )
    assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}
    site.MSHIP_CACHE_FIGURES = "none"
    hidden = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={"model": "v", "messages": [{"role": "user", "content": "mine"}]},
        headers={"authorization": f"Bearer {secret}"},
    )
    assert figures_in(hidden.text) == set()


def usage_cached(key_id: int) -> int:
    ledger.flush()
    found = UsageMinute.objects.filter(key_id=key_id).aggregate(n=Sum("tokens_cached"))["n"]
    return int(found or 0)


async def test_it_takes_figures_out_of_events_however_the_engine_splits_them() -> None:
    """An event across three reads, one named by an `event:` line (Anthropic's), its usage
    inside `message` (message_start): each rewritten whole, the stream's framing kept."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    record = RequestRecord("POST", "/v1/messages", "r")
    hider = FigureHider(send, record, streaming=True)
    start = {"type": "message_start", "message": {"usage": {"cache_read_input_tokens": 9}}}
    stream = (
        b"event: message_start\ndata: " + json.dumps(start).encode() + b"\n\n"
        b'data: {"choices": [], "timings": {"cache_n": 4}, "id_slot": 1}\n\n'
        b"data: [DONE]\n\n"
    )
    await hider(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]}
    )
    for at, part in enumerate((stream[:30], stream[30:90], stream[90:])):
        await hider({"type": "http.response.body", "body": part, "more_body": at < 2})
    assert sent[0]["headers"] == []  # its length changed
    out = b"".join(m.get("body", b"") for m in sent[1:])
    assert figures_in(out.decode()) == set() and b"cache_read_input_tokens" not in out
    assert out.startswith(b"event: message_start\ndata: {") and out.endswith(b"data: [DONE]\n\n")
    assert out.count(b"\n\n") == 3 and record.cached_seen == 9
