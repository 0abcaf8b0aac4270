"""The public /v1 gateway, called with the official openai and anthropic SDKs."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import traceback
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
from django.db.backends import utils

from deployments.models import Deployment
from deployments.runtimes.process import free_port
from openai_api.catalog import catalog
from openai_api.models import ApiKey
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway

Serving = Callable[..., Deployment]


def client(gateway_url: str, key: str, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, **options)


@pytest.mark.sample("models")
def test_it_lists_and_retrieves_models(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim", aliases=["chat"])
    sdk = client(gateway_url, api_key())
    assert [m.id for m in sdk.models.list()] == ["sim", "chat"]
    assert sdk.models.retrieve("chat").id == "chat"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.models.retrieve("nope")
    assert missing.value.code == "model_not_found"


@pytest.mark.sample("chat")
def test_it_answers_chat_by_name_and_by_alias(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim", aliases=["chat"], config={"reply": "hello there"})
    sdk = client(gateway_url, api_key())
    for name in ("sim", "chat"):
        answer = sdk.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "hello there"
    raw = sdk.chat.completions.with_raw_response.create(
        model="sim",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-request-id": "abc-123"},
    )
    assert raw.headers["x-request-id"] == "abc-123"


@pytest.mark.sample("chat")
def test_it_streams_chunks_while_the_engine_is_still_generating(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    engine = serving("sim", config={"tokens_per_second": 20}).engine_url
    sdk = client(gateway_url, api_key())
    stream = sdk.chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        max_tokens=30,
        stream_options={"include_usage": True},
    )
    texts = []
    running_at_first_token = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if running_at_first_token is None:
                running_at_first_token = httpx.get(engine + "/sim/stats").json()["running"]
            texts.append(chunk.choices[0].delta.content)
        if chunk.usage:
            assert chunk.usage.completion_tokens == 30
    assert running_at_first_token == 1  # the first token came before the engine finished
    assert len(texts) == 30


@pytest.mark.sample("completions", "embeddings")
def test_it_serves_completions_and_embeddings(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("gen", config={"reply": "a b c"})
    serving("emb", usecase="embed", config={"embedding_dim": 8})
    sdk = client(gateway_url, api_key())
    assert sdk.completions.create(model="gen", prompt="x").choices[0].text == "a b c"
    vectors = sdk.embeddings.create(model="emb", input=["one", "two", "one"]).data
    assert len(vectors) == 3 and len(vectors[0].embedding) == 8
    assert vectors[0].embedding == vectors[2].embedding != vectors[1].embedding


@pytest.mark.sample("models")
def test_it_refuses_missing_wrong_and_revoked_keys(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("sim")
    secret = api_key()
    no_key = httpx.get(gateway_url + "/v1/models")
    assert no_key.status_code == 401
    assert no_key.json()["error"]["code"] == "invalid_api_key"
    for wrong in ("sk-not-ours", secret[:-2] + "xx", "msk-00000000-" + "a" * 43):
        with pytest.raises(openai.AuthenticationError):
            client(gateway_url, wrong).models.list()
    # The Anthropic SDK's header is accepted as well as a bearer token.
    by_header = httpx.get(gateway_url + "/v1/models", headers={"x-api-key": secret})
    assert by_header.status_code == 200
    prefix = secret.split("-")[1]
    ApiKey.objects.filter(prefix=prefix).update(revoked=True)
    seen_by_gateway(lambda s: s.keys[prefix].revoked)
    with pytest.raises(openai.AuthenticationError) as revoked:
        client(gateway_url, secret).models.list()
    assert "revoked" in str(revoked.value)


@pytest.mark.redis
def test_it_enforces_allowed_models_and_the_rate_limit(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("open")
    serving("closed")
    sdk = client(gateway_url, api_key(allowed_models=["open"], requests_per_minute=3))
    assert [m.id for m in sdk.models.list()] == ["open"]
    with pytest.raises(openai.NotFoundError) as hidden:  # 404: it learns nothing of the model
        sdk.chat.completions.create(model="closed", messages=[{"role": "user", "content": "x"}])
    assert hidden.value.code == "model_not_found"
    # The listing and the refused request counted: every request is checked before anything
    # else is done for it.
    sdk.chat.completions.create(model="open", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.RateLimitError) as limited:
        sdk.chat.completions.create(model="open", messages=[{"role": "user", "content": "x"}])
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60


def test_it_names_unknown_models_and_unserved_endpoints(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("emb", usecase="embed")
    sdk = client(gateway_url, api_key())
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as unserved:
        sdk.chat.completions.create(model="emb", messages=[{"role": "user", "content": "x"}])
    assert unserved.value.code == "unsupported_endpoint"
    assert "does not serve /v1/chat/completions" in str(unserved.value)


def test_it_answers_503_for_a_deployment_that_is_not_ready(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    make_deployment("idle")
    seen_by_gateway(lambda s: "idle" in s.routes)
    with pytest.raises(openai.APIStatusError) as refused:
        client(gateway_url, api_key()).chat.completions.create(
            model="idle", messages=[{"role": "user", "content": "x"}]
        )
    assert refused.value.status_code == 503
    assert "the always-on deployment is planned" in str(refused.value)


def test_it_answers_502_when_the_engine_cannot_be_reached(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:

    site.MSHIP_ROUTE_REFRESH_S = 0.05
    nobody = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    make_deployment("gone", state="ready", engine_urls=[nobody])
    seen_by_gateway(lambda s: "gone" in s.routes)
    with pytest.raises(openai.APIStatusError) as failed:
        client(gateway_url, api_key()).chat.completions.create(
            model="gone", messages=[{"role": "user", "content": "x"}]
        )
    assert failed.value.status_code == 502
    assert failed.value.code == "upstream_error"


def test_it_passes_engine_errors_through_unchanged(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    deployment = serving("sim")
    httpx.post(deployment.engine_url + "/sleep")  # the engine now answers 503 itself
    with pytest.raises(openai.APIStatusError) as failed:
        client(gateway_url, api_key()).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}]
        )
    assert failed.value.status_code == 503
    assert failed.value.code == "engine_sleeping"


class ErrorEngine:
    """Whatever answers at an engine's address with a 500 of a numeric code, `pad` bytes
    long: llama.cpp's shape, or a broken proxy's flood."""

    def __init__(self) -> None:
        self.pad = 0
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                error = {"message": "x" * engine.pad, "type": "server_error", "code": 500}
                body = json.dumps({"error": error}).encode()
                self.send_response(500)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_it_words_an_engine_error_code_but_passes_a_huge_error_on_as_it_came(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    """An engine's numeric error code becomes OpenAI's word; an error body past the gateway's
    read cap (1 MiB) is not held whole in memory to do it: it goes on byte for byte."""
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    engine = ErrorEngine()
    try:
        make_deployment("flood", state="ready", engine_urls=[engine.url])
        seen_by_gateway(lambda s: "flood" in s.routes)
        sdk = client(gateway_url, api_key())
        with pytest.raises(openai.InternalServerError) as small:
            sdk.chat.completions.create(model="flood", messages=[{"role": "user", "content": "x"}])
        assert small.value.code == "engine_error"
        engine.pad = 3 << 20
        huge = httpx.post(
            gateway_url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {api_key()}"},
            json={"model": "flood", "messages": [{"role": "user", "content": "x"}]},
            timeout=30,
        )
        assert huge.status_code == 500
        assert huge.json()["error"]["code"] == 500  # as the engine sent it
        assert len(huge.json()["error"]["message"]) == 3 << 20
    finally:
        engine.server.shutdown()


@pytest.mark.sample("messages")
def test_it_speaks_anthropic_messages(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    serving("claude-ish", config={"reply": "bonjour tout le monde"})
    sdk = anthropic.Anthropic(base_url=gateway_url, api_key=api_key(), max_retries=0)
    message = sdk.messages.create(
        model="claude-ish", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].text == "bonjour tout le"  # type: ignore[union-attr]
    with sdk.messages.stream(
        model="claude-ish", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
    assert text == "bonjour tout le monde"


def test_it_cancels_the_engine_request_when_the_client_hangs_up(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:
    engine = serving("sim", config={"tokens_per_second": 10, "max_tokens": 200}).engine_url
    sdk = client(gateway_url, api_key())
    stream = sdk.chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_headers={"x-request-id": "leaving-1"},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()
    wait_until(lambda: httpx.get(engine + "/sim/cancellations").json()["count"] == 1, 10)
    record = httpx.get(engine + "/sim/cancellations").json()["cancelled"][0]
    assert record["request_id"] == "leaving-1"


def test_it_forwards_a_multipart_upload_intact(
    gateway_url: str, api_key: Callable[..., str], serving: Serving
) -> None:

    serving("ears", usecase="transcription")
    audio = bytes(range(256)) * 4000
    result = client(gateway_url, api_key()).audio.transcriptions.create(
        model="ears", file=("speech.wav", audio, "audio/wav")
    )
    assert result.text == f"{len(audio)} bytes sha256={hashlib.sha256(audio).hexdigest()}"


@pytest.mark.postgres
def test_it_makes_no_database_query_while_it_streams(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Serving,
    site: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    serving("sim", config={"tokens_per_second": 50})
    sdk = client(gateway_url, api_key())
    sdk.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}])
    # The catalog's refresher: one last load, then asleep through the stream.
    site.MSHIP_ROUTE_REFRESH_S = 3600
    loaded = catalog.snapshot.loaded_at if catalog.snapshot else 0.0
    seen_by_gateway(lambda s: s.loaded_at > loaded)
    queries: list[str] = []
    lock = threading.Lock()
    original = utils.CursorWrapper.execute

    def counting(self: Any, sql: str, params: Any = None) -> Any:
        # The route table's reload runs beside requests, on its own timer, never in one: a
        # reload already under way when the interval changed may still land in the window.
        reload = any(
            frame.name == "load" and frame.filename.endswith("openai_api/catalog.py")
            for frame in traceback.extract_stack()
        )
        if not reload:
            with lock:
                queries.append(sql)
        return original(self, sql, params)

    monkeypatch.setattr(utils.CursorWrapper, "execute", counting)
    stream = sdk.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=20
    )
    assert len([c for c in stream if c.choices and c.choices[0].delta.content]) == 20
    assert queries == []


def test_it_refuses_bodies_over_the_limit_and_bad_json(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, site: Any
) -> None:
    serving("sim")
    site.MSHIP_MAX_BODY_BYTES = 1024
    headers = {"authorization": f"Bearer {api_key()}"}
    big = httpx.post(
        gateway_url + "/v1/chat/completions",
        headers=headers,
        json={"model": "sim", "messages": [{"role": "user", "content": "x" * 2000}]},
    )
    assert big.status_code == 413
    assert big.json()["error"]["code"] == "request_too_large"
    bad = httpx.post(gateway_url + "/v1/chat/completions", headers=headers, content=b"{nope")
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_json")
    assert bad.headers["x-request-id"]


def test_it_keeps_cors_closed_unless_configured(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, site: Any
) -> None:
    serving("sim")
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST"}
    assert httpx.options(gateway_url + "/v1/chat/completions", headers=preflight).status_code == 403
    site.MSHIP_CORS_ORIGINS = ["https://app.example"]
    opened = httpx.options(gateway_url + "/v1/chat/completions", headers=preflight)
    assert opened.status_code == 204
    assert opened.headers["access-control-allow-origin"] == "https://app.example"
    listed = httpx.get(
        gateway_url + "/v1/models",
        headers={"origin": "https://app.example", "authorization": f"Bearer {api_key()}"},
    )
    assert listed.headers["access-control-allow-origin"] == "https://app.example"


def test_it_sends_no_keepalive_once_the_engine_is_called(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, site: Any
) -> None:
    """A warm model that is slow to answer: Modelship waits for nothing, so the answer is
    exactly the engine's, its status included (keepalives would have committed a 200)."""
    serving("slow", config={"first_token_delay_s": 1.0})
    serving("broken", config={"first_token_delay_s": 1.0, "fail_status": 500})
    site.MSHIP_SSE_KEEPALIVE_S = 0.2
    headers = {"authorization": f"Bearer {api_key()}"}
    body = {"model": "slow", "messages": [{"role": "user", "content": "x"}], "stream": True}
    url = gateway_url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers) as answer:
        assert answer.headers["content-type"] == "text/event-stream"
        lines = [line for line in answer.iter_lines() if line]
    assert lines[0].startswith("data: {") and lines[-1] == "data: [DONE]"
    assert not any(line.startswith(":") for line in lines)  # no comment of ours
    failed = httpx.post(url, json={**body, "model": "broken"}, headers=headers)
    assert failed.status_code == 500
    assert failed.json()["error"]["message"] == "The simulated engine failed as it was told to."


def test_it_spreads_requests_over_replicas_by_outstanding_requests(
    gateway_url: str, api_key: Callable[..., str], serving: Serving, site: Any
) -> None:
    site.MSHIP_ROUTING_POLICY = "least-outstanding"  # four of one conversation: no affinity
    deployment = serving("pair", num_replicas=2, config={"tokens_per_second": 20})
    sdk = client(gateway_url, api_key())
    streams = [
        sdk.chat.completions.create(
            model="pair", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=40
        )
        for _ in range(4)
    ]
    for stream in streams:  # every stream has started on an engine
        next(iter(stream))
    running = [httpx.get(url + "/sim/stats").json()["running"] for url in deployment.engine_urls]
    assert running == [2, 2]
    for stream in streams:
        stream.close()
