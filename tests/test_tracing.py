"""Traces from the gateway to the engine (README, "Traces"): spans received by an OTLP/HTTP
receiver in the test's process, as a collector would receive them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

from common import tracing
from deployments.loaders import EngineSpec, get_loader
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway
from tests.otlp_receiver import Receiver

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.usefixtures("engines")
SERVER, CLIENT = 2, 3  # OTLP's span kinds
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def ask_as_caller(gateway_url: str, key: str, model: str) -> None:
    """A chat request made inside the caller's trace (its W3C traceparent)."""
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers={
            "authorization": f"Bearer {key}",
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    tracing.configure(found.url, delay_ms=50)
    yield found
    tracing.shutdown()
    found.close()


def test_it_traces_a_cold_on_demand_request_from_the_caller_to_the_engine(
    receiver: Receiver,
    gateway_url: str,
    api_key: Callable[..., str],
    make_deployment: Any,
    site: Any,
    access_lines: list[dict[str, Any]],
) -> None:
    lazy = make_deployment(
        "lazy", mode="on_demand", idle_timeout_s=60, config={"startup_delay_s": 0.3}
    )
    seen_by_gateway(lambda s: "lazy" in s.routes)
    ask_as_caller(gateway_url, api_key(), "lazy")
    tracing.flush()
    root = receiver.named("POST /v1/chat/completions", CALLER_TRACE)
    assert (root.trace_id, root.parent_id, root.kind) == (CALLER_TRACE, CALLER_SPAN, SERVER)
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["modelship.model"] == "lazy"
    assert root.attributes["modelship.waited"] == "start"
    assert "first byte" in root.events and root.service == "modelship"
    auth = receiver.named("modelship.auth", CALLER_TRACE)
    slot = receiver.named("modelship.slot", CALLER_TRACE)
    start = receiver.named("modelship.ondemand.start", CALLER_TRACE)
    engine = receiver.named("modelship.engine", CALLER_TRACE)
    assert auth.parent_id == slot.parent_id == engine.parent_id == root.span_id
    assert start.parent_id == slot.span_id
    assert start.attributes["modelship.deployment"] == "lazy"
    for phase in ("modelship.ondemand.prepare", "modelship.ondemand.launch"):
        assert receiver.named(phase, CALLER_TRACE).parent_id == start.span_id
    assert engine.kind == CLIENT
    # The engine was asked under the engine call's span: it continues the same trace.
    lazy.refresh_from_db()
    headers = httpx.get(lazy.engine_urls[0] + "/sim/last_chat_headers").json()
    assert headers["traceparent"] == f"00-{CALLER_TRACE}-{engine.span_id}-01"
    wait_until(lambda: any(line.get("model") == "lazy" for line in access_lines), 10)
    line = next(line for line in access_lines if line.get("model") == "lazy")
    assert line["trace_id"] == CALLER_TRACE


def test_it_traces_nothing_and_logs_no_trace_id_when_off(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Any],
    access_lines: list[dict[str, Any]],
) -> None:
    assert not tracing.ENABLED
    engine = serving("sim").engine_url
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={"model": "sim", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {api_key()}"},
    )
    assert answer.status_code == 200
    assert "traceparent" not in httpx.get(engine + "/sim/last_chat_headers").json()
    wait_until(lambda: any(line.get("model") == "sim" for line in access_lines), 10)
    assert all("trace_id" not in line for line in access_lines)


def test_it_points_vllm_at_the_sites_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = get_loader("vllm")
    spec = EngineSpec(name="m", model="org/model")
    assert "--otlp-traces-endpoint" not in vllm.argv(spec, "h", "1")
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in vllm.env(spec)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    argv = vllm.argv(spec, "h", "1")
    at = argv.index("--otlp-traces-endpoint")
    assert argv[at + 1] == "http://collector:4318/v1/traces"
    assert vllm.env(spec)["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")  # the OpenTelemetry way to turn it off
    assert "--otlp-traces-endpoint" not in vllm.argv(spec, "h", "1")


def test_it_starts_a_trace_of_its_own_where_callers_are_not_followed(
    receiver: Receiver,
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MSHIP_TRACES_FOLLOW_CALLER=false: a caller's traceparent (and its sampled flag) does
    not decide the request's trace; the caller's is linked."""
    monkeypatch.setattr(tracing, "FOLLOW_CALLER", False)
    serving("sim")
    ask_as_caller(gateway_url, api_key(), "sim")
    tracing.flush()
    wait_until(lambda: any(s.name == "POST /v1/chat/completions" for s in receiver.spans), 10)
    root = next(s for s in receiver.spans if s.name == "POST /v1/chat/completions")
    assert root.trace_id != CALLER_TRACE and root.parent_id == ""
    assert root.links == ((CALLER_TRACE, CALLER_SPAN),)


def test_it_cuts_what_a_caller_sends_to_the_cap_before_it_authenticates(
    receiver: Receiver, gateway_url: str
) -> None:
    """A 60 KiB path, without a key: the span's name and each of its values hold at most
    tracing.CAP characters, a cut one ending in tracing.CUT."""
    long = "a" * 60 * 1024
    answer = httpx.get(f"{gateway_url}/v1/responses/resp_1/{long}", timeout=30)
    assert answer.status_code == 401, answer.text[:200]
    tracing.flush()
    wait_until(lambda: any(s.kind == SERVER for s in receiver.spans), 10)
    root = next(s for s in receiver.spans if s.kind == SERVER)
    assert len(root.name) == tracing.CAP, root.name[:80]
    assert root.name.startswith("GET /v1/responses/{id}/aaaa")
    assert root.name.endswith(tracing.CUT)
    endpoint = root.attributes["modelship.endpoint"]
    assert len(endpoint) == tracing.CAP
    assert endpoint.startswith("responses/resp_1/aaaa") and endpoint.endswith(tracing.CUT)
    texts = [v for s in receiver.spans for v in s.attributes.values() if isinstance(v, str)]
    assert all(len(text) <= tracing.CAP for text in texts)


def test_it_samples_a_request_by_the_sites_rule_whatever_its_callers_traceparent_says(
    receiver: Receiver,
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Any],
    access_lines: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller's sampled `traceparent` (…-01): at a ratio of 0 nothing is recorded (the trace
    id is continued, unsampled, to the engine); at 1 the request's span is."""
    engine = serving("sim").engine_url
    key = api_key()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    tracing.configure(receiver.url, delay_ms=50)
    ask_as_caller(gateway_url, key, "sim")
    sent = httpx.get(engine + "/sim/last_chat_headers").json()["traceparent"]
    assert sent.startswith(f"00-{CALLER_TRACE}-") and sent.endswith("-00")
    wait_until(lambda: any(line.get("trace_id") == CALLER_TRACE for line in access_lines), 10)
    tracing.flush()
    assert receiver.spans == []

    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1")
    tracing.configure(receiver.url, delay_ms=50)
    ask_as_caller(gateway_url, key, "sim")
    tracing.flush()
    root = receiver.named("POST /v1/chat/completions", CALLER_TRACE)
    assert (root.parent_id, root.kind) == (CALLER_SPAN, SERVER)
    sent = httpx.get(engine + "/sim/last_chat_headers").json()["traceparent"]
    assert sent.endswith("-01")


def test_it_lets_no_trace_id_a_caller_picks_get_its_requests_past_the_ratio(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ratio decides by the trace id's low 64 bits: a caller's trace id of zeros there
    (and its flag, sampled or not) would be traced every time; it is traced about as often
    as the ratio says."""
    chosen = "4bf92f3577b34da60000000000000000"
    for rule in ("traceidratio", "parentbased_traceidratio"):
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", rule)
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
        tracing.configure(receiver.url, delay_ms=50)
        for flags in ("00", "01"):
            headers = {"traceparent": f"00-{chosen}-{CALLER_SPAN}-{flags}"}
            traced = 0
            for _ in range(200):
                with tracing.server_span("GET /v1/models", headers) as span:
                    assert tracing.trace_id_of(span) == chosen  # the caller's trace goes on
                    with tracing.span("modelship.auth") as child:
                        assert child.is_recording() == span.is_recording()
                    traced += span.is_recording()
            assert 50 < traced < 150, (rule, flags, traced)
