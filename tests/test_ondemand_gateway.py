"""The on-demand gateway, /ondemand/{id}/v1/..., called for real over TCP from a peer address
of the loopback network (127.0.0.2), with the seed's checks in their order."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments import deployer
from deployments.models import Deployment, State
from deployments.runtimes.process import free_port
from ondemand.registry import controllers
from openai_api.forwarder import forwarder
from tests.conftest import in_thread, wait_until
from tests.gateway_support import OTHER, OnDemandSite, reread_guard, seen_by_gateway
from tests.local_http import local_http

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")


def deploy(make_deployment: Any, name: str, **fields: Any) -> Deployment:
    fields.setdefault("mode", "on_demand")
    fields.setdefault("idle_timeout_s", 60)
    deployment: Deployment = make_deployment(name, **fields)
    seen_by_gateway(lambda s: name in s.routes)
    return deployment


def started(deployment: Deployment) -> Deployment:
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    seen_by_gateway(lambda s: s.routes[deployment.name].state == "ready")
    return deployment


def engine_stats(deployment: Deployment) -> dict[str, Any]:
    deployment.refresh_from_db()
    stats: dict[str, Any] = httpx.get(deployment.engine_urls[0] + "/sim/stats").json()
    return stats


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


CHAT = {"model": "any", "messages": [{"role": "user", "content": "hi"}]}


# --- traffic --------------------------------------------------------------------------------


@pytest.mark.sample("ondemand")
def test_it_starts_the_model_on_the_first_request_and_returns_its_answer(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    lazy = deploy(make_deployment, "od-lazy", config={"reply": "from the engine"})
    answer = ondemand_site.sdk(lazy).chat.completions.create(
        model="od-lazy", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content == "from the engine"
    lazy.refresh_from_db()
    assert lazy.state == State.READY
    stream = ondemand_site.sdk(lazy).chat.completions.create(
        model="od-lazy", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "from the engine"


def test_it_sends_a_waiting_stream_nothing_and_refuses_a_failed_start_with_its_status(
    ondemand_site: OnDemandSite, make_deployment: Any, site: Any
) -> None:
    """LiteLLM calls /ondemand: a Responses or messages stream that waits for a start gets
    no keepalive, so its answer is exactly the engine's, and a start that fails is 503
    start_failed, not an event inside a 200 (the seed; /v1 keeps its keepalives)."""
    site.MSHIP_SSE_KEEPALIVE_S = 0.1
    cold = deploy(make_deployment, "od-cold-stream", config={"startup_delay_s": 1.0})
    with (
        ondemand_site.client(cold) as client,
        client.stream("POST", "/responses", json={"input": "x", "stream": True}) as answer,
    ):
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line]
    assert lines[0] == "event: response.created"
    assert not any(line.startswith(":") for line in lines)
    assert "event: response.completed" in lines
    failing = {"startup_delay_s": 1.0, "fail_at_start": True}
    for endpoint, body in (
        ("/responses", {"input": "x", "stream": True}),
        ("/messages", {"max_tokens": 8, "messages": CHAT["messages"], "stream": True}),
    ):
        doomed = deploy(make_deployment, f"od-doomed{endpoint.replace('/', '-')}", config=failing)
        with ondemand_site.client(doomed) as client:
            refused = client.post(endpoint, json=body)
        assert error_of(refused) == (503, "start_failed"), endpoint


def test_it_forwards_to_an_always_on_deployment_only_while_ready_and_never_starts_it(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    steady = deploy(make_deployment, "od-steady", mode=None, config={"reply": "steady"})
    with ondemand_site.client(steady) as client:
        refused = client.post("/chat/completions", json=CHAT)
        assert error_of(refused) == (503, "not_on_demand")
        steady.refresh_from_db()
        assert steady.state == State.PLANNED  # the gateway never starts it
        started(steady)
        answer = client.post("/chat/completions", json=CHAT)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"] == "steady"


def test_it_answers_502_when_the_engine_cannot_be_reached(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:

    gone = deploy(make_deployment, "od-gone", mode=None)
    Deployment.objects.filter(pk=gone.pk).update(
        state="ready", engine_urls=[f"http://127.0.0.1:{free_port('127.0.0.1')}"]
    )
    seen_by_gateway(lambda s: s.routes["od-gone"].state == "ready")
    with ondemand_site.client(gone) as client:
        answer = client.post("/chat/completions", json=CHAT)
    assert error_of(answer) == (502, "ondemand_upstream_error")
    # The message names the deployment, never the engine's address.
    message = answer.json()["error"]["message"]
    assert "od-gone" in message and "127.0.0.1" not in message


def test_it_passes_an_engine_error_through_unchanged(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    """The seed: engine 4xx/5xx answers pass through unchanged; the numeric code vLLM and
    llama.cpp write is not made a word here, and the body is the engine's to the byte."""
    said = b'{"error":{"message":"bad  input","type":"BadRequestError","param":null,"code":400}}'

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(said)))
            self.end_headers()
            self.wfile.write(said)

        def log_message(self, *args: Any) -> None:
            pass

    with local_http(Refusing) as url:
        refusing = deploy(make_deployment, "od-refusing", state="ready", engine_urls=[url])
        seen_by_gateway(lambda s: s.routes["od-refusing"].state == "ready")
        with ondemand_site.client(refusing) as client:
            for body in (CHAT, {**CHAT, "stream": True}):
                answer = client.post("/chat/completions", json=body)
                assert (answer.status_code, answer.content) == (400, said)


def test_it_sends_no_keepalive_while_an_always_on_adapter_loads(
    ondemand_site: OnDemandSite, make_deployment: Any, site: Any, tmp_path: Path
) -> None:
    """The seed promises /ondemand no keepalives: a stream for an always-on vLLM base's
    adapter (switched while LiteLLM still points here) gets nothing while the adapter loads
    into the base, and then exactly the engine's bytes."""
    site.MSHIP_SSE_KEEPALIVE_S = 0.05
    said = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
    loads: list[str] = []

    class Vllm(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # its models: the base, no adapter loaded yet
            self.answer(b'{"data":[{"id":"od-base"}]}', "application/json")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if self.path == "/v1/load_lora_adapter":
                time.sleep(0.5)  # the engine loads it slowly: ten keepalive beats
                loads.append(body["lora_name"])
                self.answer(b"ok", "text/plain")
            else:
                self.answer(said, "text/event-stream")

        def answer(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with local_http(Vllm) as url:
        base = deploy(
            make_deployment, "od-base", mode=None, loader="vllm", state="ready", engine_urls=[url]
        )
        make_deployment("od-lora", loader="vllm", model=str(tmp_path), adapter_of=base)
        seen_by_gateway(lambda s: "od-lora" in s.routes and s.routes["od-lora"].state == "ready")
        with (
            ondemand_site.client(base) as client,
            client.stream(
                "POST", "/chat/completions", json={**CHAT, "model": "od-lora", "stream": True}
            ) as answer,
        ):
            assert answer.status_code == 200
            assert answer.read() == said
    assert loads == ["od-lora"]


# --- check 1: the peer guard ------------------------------------------------------------------


def test_it_lets_only_allowed_peers_without_forwarding_headers_pass(
    ondemand_site: OnDemandSite, make_deployment: Any, site: Any
) -> None:
    dep = deploy(make_deployment, "od-peer")
    with ondemand_site.client(dep) as client:
        assert client.get("/models").status_code == 200
    with ondemand_site.client(dep, source=OTHER) as stranger:
        assert error_of(stranger.get("/models")) == (404, "not_found")
    for header in ("x-forwarded-for", "forwarded", "x-real-ip"):
        with ondemand_site.client(dep, **{header: "10.1.2.3"}) as proxied:
            assert error_of(proxied.get("/models")) == (404, "not_found")
    # The refusal comes before any other check: a bad path or key from a stranger is 404 too.
    assert ondemand_site.raw("GET", f"/ondemand/{dep.pk}/v1/../x", source=OTHER) == (
        404,
        "not_found",
    )
    # Outside Docker, "auto" allows nobody.
    site.MSHIP_ONDEMAND_ALLOWED_CIDRS = "auto"
    reread_guard()
    with ondemand_site.client(dep) as client:
        assert error_of(client.get("/models")) == (404, "not_found")
    site.MSHIP_ONDEMAND_ALLOWED_CIDRS = "127.0.0.0/8"
    reread_guard()
    with ondemand_site.client(dep, source=OTHER) as neighbour:
        assert neighbour.get("/models").status_code == 200


# --- check 2: the path ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        "/v1/./models",
        "/v1/../v1/models",
        "/v1//models",
        "/v1/models/",
        "/v1/models%2Fx",
        "/v1/models%5Cx",
        "/v1/models%23x",
        "/v1/models%3Fx",
        "/v1/models%00x",
        "/v1/models%0Ax",
        "/v1/models\\x",
        "/v1/models/%ff%fe",  # not UTF-8
        "/v1/models?",  # a bare `?`: the seed's rule, though ASGI sees no query
    ],
)
def test_it_refuses_an_unclean_path_with_400(
    ondemand_site: OnDemandSite, make_deployment: Any, tail: str
) -> None:
    dep = deploy(make_deployment, "od-path")
    assert ondemand_site.raw("GET", f"/ondemand/{dep.pk}{tail}") == (400, "invalid_path")


def test_it_answers_an_id_of_4400_digits_with_404(ondemand_site: OnDemandSite) -> None:
    assert ondemand_site.raw("GET", f"/ondemand/{'9' * 4400}/v1/models") == (404, "not_found")


# --- checks 3 to 5: the key -----------------------------------------------------------------


def test_it_answers_503_without_a_key_file_and_reads_a_new_one(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    dep = deploy(make_deployment, "od-nokey")
    ondemand_site.key_file.unlink()
    reread_guard()
    with ondemand_site.client(dep) as client:
        assert error_of(client.get("/models")) == (503, "ondemand_not_configured")
        ondemand_site.key_file.write_text("")  # empty: still closed
        time.sleep(1.1)  # the file is looked at no more than once a second
        assert error_of(client.get("/models")) == (503, "ondemand_not_configured")
        ondemand_site.key_file.write_text(ondemand_site.key)
        wait_until(lambda: client.get("/models").status_code == 200, 5)


def test_it_refuses_a_wrong_key_and_locks_out_a_peer_after_twenty_failures(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    dep = deploy(make_deployment, "od-key")
    with ondemand_site.client(dep, authorization="Bearer wrong") as bad:
        for _ in range(20):
            assert error_of(bad.get("/models")) == (401, "invalid_api_key")
        locked = bad.get("/models")
        assert error_of(locked) == (429, "rate_limited")
        assert locked.headers["retry-after"] == "60"
    with ondemand_site.client(dep) as good:
        assert error_of(good.get("/models")) == (429, "rate_limited")  # even with the key
    with ondemand_site.client(dep, authorization="") as anonymous:
        anonymous.headers.pop("authorization")
        assert error_of(anonymous.get("/models")) == (429, "rate_limited")


def test_it_takes_a_rotated_key_and_refuses_the_old_one_without_counting_it(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    dep = deploy(make_deployment, "od-rotate")
    with ondemand_site.client(dep, authorization="Bearer wrong") as bad:
        for _ in range(19):
            bad.get("/models")
    new_key = "odk-" + secrets.token_hex(16)
    fresh = ondemand_site.key_file.with_name("key.new")
    fresh.write_text(new_key)
    os.replace(fresh, ondemand_site.key_file)  # a new inode, as a rotation writes it
    with ondemand_site.client(dep, authorization=f"Bearer {new_key}") as rotated:
        wait_until(lambda: rotated.get("/models").status_code == 200, 5)
    with ondemand_site.client(dep) as old:
        for _ in range(25):  # LiteLLM keeps the old key until its next sync
            assert error_of(old.get("/models")) == (401, "invalid_api_key")
    # Neither the 19 failures before the rotation nor the old key counted.
    with ondemand_site.client(dep, authorization=f"Bearer {new_key}") as rotated:
        assert rotated.get("/models").status_code == 200


# --- check 6: the body ----------------------------------------------------------------------


def test_it_refuses_a_body_over_16_mib(ondemand_site: OnDemandSite, make_deployment: Any) -> None:
    dep = deploy(make_deployment, "od-big")
    big = b'{"model": "x", "prompt": "' + b"a" * (16 * 2**20) + b'"}'
    with ondemand_site.client(dep) as client:
        answer = client.post(
            "/completions", content=big, headers={"content-type": "application/json"}
        )
        assert error_of(answer) == (413, "request_too_large")
    dep.refresh_from_db()
    assert dep.state == State.PLANNED


# --- check 7 and the routes -----------------------------------------------------------------


def test_it_refuses_unknown_and_system_deployments_and_unknown_routes(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    dep = deploy(make_deployment, "od-routes")
    decider = deploy(make_deployment, "od-decider", mode=None, system=True)
    with ondemand_site.client(dep) as client:
        missing = client.post(f"{ondemand_site.url}/ondemand/999999/v1/chat/completions", json=CHAT)
        assert error_of(missing) == (404, "not_found")
        named = client.post(
            f"{ondemand_site.url}/ondemand/od-routes/v1/chat/completions", json=CHAT
        )
        assert error_of(named) == (404, "not_found")
        # Superscript two, Arabic-Indic 3 and 12, fullwidth 1: an id is ASCII digits only.
        for ident in ("%C2%B2", "%D9%A3", "%D9%A1%D9%A2", "%EF%BC%91"):
            unicode_digit = client.get(f"{ondemand_site.url}/ondemand/{ident}/v1/models")
            assert error_of(unicode_digit) == (404, "not_found"), ident
        for method, tail in [
            ("POST", "/tokenize"),
            ("POST", "/messages/count_tokens"),
            ("GET", "/responses/resp_1"),
            ("GET", "/chat/completions"),
            ("POST", "/../sleep"),
        ]:
            answer = client.request(method, tail, json=CHAT)
            assert answer.status_code in (400, 404), (method, tail)
        # vLLM's development mode (sleep mode) serves these without auth: never forwarded.
        for tail in (
            *("/sleep", "/metrics", "/health", "/wake_up"),
            *("/collective_rpc", "/v1/collective_rpc", "/v1/../collective_rpc"),
        ):
            answer = client.post(f"{ondemand_site.url}/ondemand/{dep.pk}{tail}", json=CHAT)
            assert error_of(answer) == (404, "not_found")
    with ondemand_site.client(decider) as client:
        assert error_of(client.post("/chat/completions", json=CHAT)) == (503, "not_on_demand")
    dep.refresh_from_db()
    assert dep.state == State.PLANNED  # none of it started the model


def test_it_lists_models_from_the_record_and_one_model_only_from_a_ready_engine(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    dep = deploy(make_deployment, "od-models", aliases=["odm"])
    with ondemand_site.client(dep) as client:
        listed = client.get("/models").json()
        assert [(m["id"], m["owned_by"]) for m in listed["data"]] == [("od-models", "modelship")]
        assert error_of(client.get("/models/od-models")) == (503, "ondemand_not_ready")
        dep.refresh_from_db()
        assert dep.state == State.PLANNED  # listing never wakes it
        started(dep)
        card = client.get("/models/od-models")
        assert card.status_code == 200 and card.json()["id"] == "od-models"
        assert client.head("/models/od-models").status_code == 200
        assert client.get("/models/nope").status_code == 404  # the engine's own answer


# --- health probes --------------------------------------------------------------------------


def test_it_answers_health_probes_without_the_engine(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    dep = deploy(make_deployment, "od-probe", config={"embedding_dim": 4})
    probe = {"x-modelship-health-check": "1"}
    with ondemand_site.client(dep, **probe) as client:
        chat = client.post("/chat/completions", json=CHAT)
        assert chat.status_code == 200
        assert chat.headers["x-modelship-ondemand-state"] == "planned"
        assert chat.json()["choices"][0]["message"] == {"role": "assistant", "content": ""}
        streamed = client.post("/chat/completions", json={**CHAT, "stream": True})
        assert streamed.headers["content-type"] == "text/event-stream"
        assert streamed.text.endswith("data: [DONE]\n\n")
        assert client.post("/completions", json={"prompt": "x"}).json()["object"] == (
            "text_completion"
        )
        assert client.post("/embeddings", json={"input": "x"}).json()["object"] == "list"
        assert client.post("/responses", json={"input": "x"}).json()["object"] == "response"
        assert client.post("/messages", json={"max_tokens": 1}).json()["type"] == "message"
        unsupported = client.post("/audio/transcriptions", content=b"x")
        assert error_of(unsupported) == (503, "ondemand_health_unsupported")
    dep.refresh_from_db()
    assert dep.state == State.PLANNED  # a probe starts nothing
    started(dep)
    with ondemand_site.client(dep, **probe) as client:
        answer = client.post("/chat/completions", json=CHAT)
        assert answer.headers["x-modelship-ondemand-state"] == "ready"
    assert engine_stats(dep)["served"] == 0  # never forwarded, even to a ready engine
    with ondemand_site.client(dep, **probe, authorization="Bearer wrong") as client:
        assert error_of(client.post("/chat/completions", json=CHAT)) == (401, "invalid_api_key")
    Deployment.objects.filter(pk=dep.pk).update(state="failed")
    seen_by_gateway(lambda s: s.routes["od-probe"].state == "failed")
    with ondemand_site.client(dep, **probe) as client:
        assert error_of(client.post("/chat/completions", json=CHAT)) == (
            503,
            "ondemand_not_ready",
        )


def test_it_takes_the_seeds_probe_header_and_never_forwards_either_name(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    """The on-demand seed names the probe header x-dgxmm-health-check: an entry registered
    with it is probed as with ours, and its answer carries the seed's state header too."""
    dep = deploy(make_deployment, "od-seed-probe")
    seed_probe = {"x-dgxmm-health-check": "1"}
    with ondemand_site.client(dep, **seed_probe) as client:
        chat = client.post("/chat/completions", json=CHAT)
    assert chat.status_code == 200
    assert chat.headers["x-dgxmm-ondemand-state"] == "planned"
    assert chat.headers["x-modelship-ondemand-state"] == "planned"
    assert chat.json()["choices"][0]["message"] == {"role": "assistant", "content": ""}
    # No slot taken, nothing started.
    assert all(c.entry(dep.pk).inflight == c.entry(dep.pk).waiting == 0 for c in controllers())
    dep.refresh_from_db()
    assert dep.state == State.PLANNED
    started(dep)
    with ondemand_site.client(dep, **seed_probe) as client:
        answer = client.post("/chat/completions", json=CHAT)
    assert answer.headers["x-dgxmm-ondemand-state"] == "ready"
    assert engine_stats(dep)["served"] == 0  # never forwarded, even to a ready engine
    # Any other value is traffic: forwarded, without either header.
    not_probes = {"x-dgxmm-health-check": "0", "x-modelship-health-check": "no"}
    with ondemand_site.client(dep, **not_probes) as client:
        assert client.post("/chat/completions", json=CHAT).status_code == 200
    assert engine_stats(dep)["served"] == 1
    seen = {name.lower() for name in httpx.get(dep.engine_url + "/sim/last_chat_headers").json()}
    assert {"x-dgxmm-health-check", "x-modelship-health-check"}.isdisjoint(seen)


# --- hang-ups -------------------------------------------------------------------------------


def test_it_drops_a_queued_request_on_hang_up_and_starts_nothing(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:

    started(deploy(make_deployment, "od-busy", memory_gib=6))  # idle for less than its timeout
    waiting = deploy(make_deployment, "od-waiting", memory_gib=4)
    queued = threading.Event()

    def call() -> None:
        with (
            ondemand_site.client(waiting) as client,
            client.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as answer,
        ):
            for line in answer.iter_lines():
                if "ondemand-queued" in line:
                    queued.set()
                    return  # the client hangs up while its request waits for memory

    thread = in_thread(call)
    assert queued.wait(30)
    thread.join(10)
    # The gateway's controller: the one that saw this deployment's request.
    ctl = next(c for c in controllers() if waiting.pk in c.entries)
    wait_until(lambda: ctl.entry(waiting.pk).waiting == 0 and not ctl.queue, 10)
    waiting.refresh_from_db()
    assert waiting.state == State.PLANNED


def test_it_closes_a_replaced_engines_session_after_its_last_stream(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:

    dep = started(deploy(make_deployment, "od-moved", mode=None, config={"tokens_per_second": 20}))
    old_url = dep.engine_urls[0]
    first_chunk = threading.Event()
    text: list[str] = []

    def stream() -> None:
        with (
            ondemand_site.client(dep) as client,
            client.stream(
                "POST", "/chat/completions", json={**CHAT, "stream": True, "max_tokens": 40}
            ) as answer,
        ):
            for line in answer.iter_lines():
                first_chunk.set()
                if line:
                    text.append(line)

    thread = in_thread(stream)
    assert first_chunk.wait(30)
    assert old_url in forwarder.sessions
    # Another address for the same deployment (a replacement), while the stream runs.
    Deployment.objects.filter(pk=dep.pk).update(engine_urls=["http://127.0.0.1:9"])
    seen_by_gateway(lambda s: s.routes["od-moved"].urls == ("http://127.0.0.1:9",))
    wait_until(lambda: old_url in forwarder.retired, 5)
    assert not forwarder.sessions[old_url].closed  # still streaming
    thread.join(30)
    assert text[-1] == "data: [DONE]"
    wait_until(lambda: old_url not in forwarder.sessions, 5)


def test_it_strips_secrets_and_hop_headers_both_ways(
    ondemand_site: OnDemandSite, make_deployment: Any
) -> None:
    steady = started(deploy(make_deployment, "headers"))
    sent = {
        "cookie": "session=secret",
        "connection": "keep-alive, x-hop-only",
        "x-hop-only": "1",
        "x-app-header": "kept",
        "accept-encoding": "gzip",
    }
    with ondemand_site.client(steady, **sent) as client:
        answer = client.post("/chat/completions", json=CHAT)
    assert answer.status_code == 200
    raw = httpx.get(steady.engine_url + "/sim/last_chat_headers").json()
    seen = {name.lower(): value for name, value in raw.items()}
    # What the engine received: none of the caller's secrets or hop-by-hop headers (its
    # Authorization is the engine's own secret, not the caller's key), the bytes
    # uncompressed, the request's id.
    assert {"cookie", "x-hop-only"}.isdisjoint(seen)
    assert seen["authorization"] == f"Bearer {steady.runtime_handle['replicas'][0]['secret']}"
    assert seen["accept-encoding"] == "identity" and seen["x-app-header"] == "kept"
    assert seen["x-request-id"] == answer.headers["x-request-id"]
    # What the client got: not the engine's Server header (aiohttp's, naming its version).
    assert "aiohttp" not in answer.headers.get("server", "")
