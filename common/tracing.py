"""OpenTelemetry traces of gateway requests (README, "Traces").

Off unless the site names a collector the OpenTelemetry way (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn
it off again). Off, every call here is a check of one module flag: the SDK is not even
imported. On, spans go to the collector over OTLP/HTTP in batches, from a thread of the SDK's.

A request is one trace: its server span (continuing the caller's W3C `traceparent`), with
children for what the gateway did (auth, the wait for a slot, an on-demand start and its
phases, the engine call), and the `traceparent` of the engine call passed to the engine, so
an engine that traces (vLLM with --otlp-traces-endpoint) adds its spans under it.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

ENABLED = False
# Whether a request's trace continues the caller's `traceparent` (its trace id, its sampling
# decision): MSHIP_TRACES_FOLLOW_CALLER. Off, each request starts a trace of its own, linked
# to the caller's, so no caller can have every one of its requests traced past the sampler.
FOLLOW_CALLER = os.environ.get("MSHIP_TRACES_FOLLOW_CALLER", "true").strip().lower() != "false"
_tracer: Any = None
_provider: Any = None
_NOTHING = contextlib.nullcontext()


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def collector(env: Mapping[str, str]) -> str:
    """The collector's OTLP/HTTP traces URL the environment names ("" where none)."""
    if traces := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return traces
    if base := env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.rstrip("/") + "/v1/traces"
    return ""


def configure(endpoint: str | None = None, *, delay_ms: float | None = None) -> None:
    """Start exporting (to `endpoint`, else where the OTEL_* variables say)."""
    global ENABLED, _tracer, _provider
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    shutdown()
    name = os.environ.get("OTEL_SERVICE_NAME") or "modelship"
    _provider = TracerProvider(resource=Resource.create({"service.name": name}))
    exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    _provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=delay_ms))
    _tracer = _provider.get_tracer("modelship")
    ENABLED = True


def configure_from_env() -> None:
    if wanted(os.environ):
        configure()


def shutdown() -> None:
    """Export what is left and stop tracing."""
    global ENABLED, _tracer, _provider
    ENABLED = False
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def flush() -> None:
    if _provider is not None:
        _provider.force_flush()


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current one around a block (nothing when tracing is off)."""
    if not ENABLED:
        return _NOTHING
    started: contextlib.AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, attributes=attributes or None
    )
    return started


def client_span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span of a call out of Modelship (an engine's), whose context the callee continues."""
    if not ENABLED:
        return _NOTHING
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    started: contextlib.AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, kind=SpanKind.CLIENT, attributes=attributes
    )
    return started


@contextlib.contextmanager
def server_span(name: str, headers: Mapping[str, str]) -> Iterator[Any]:
    """The span of a request that arrived: under the caller's `traceparent`, or (not
    FOLLOW_CALLER) the root of a trace of its own, with a link to the caller's."""
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.context import Context  # noqa: PLC0415
    from opentelemetry.propagate import extract  # noqa: PLC0415

    callers = extract(headers)
    if FOLLOW_CALLER:
        context, links = callers, None
    else:
        caller = trace.get_current_span(callers).get_span_context()
        context, links = Context(), ([trace.Link(caller)] if caller.is_valid else None)
    kind = trace.SpanKind.SERVER
    with _tracer.start_as_current_span(name, context=context, kind=kind, links=links) as s:
        yield s


def inject(headers: dict[str, str]) -> None:
    """The current span's `traceparent` (and `tracestate`) added to outgoing headers."""
    if ENABLED:
        from opentelemetry.propagate import inject as put  # noqa: PLC0415

        put(headers)


def trace_id_of(current: Any) -> str:
    """A span's trace id as the W3C header writes it (32 hex digits)."""
    return f"{current.get_span_context().trace_id:032x}"


def at(perf_counter: float) -> int:
    """A time.perf_counter() reading as the epoch nanoseconds a span event takes."""
    return time.time_ns() - int((time.perf_counter() - perf_counter) * 1e9)


configure_from_env()
