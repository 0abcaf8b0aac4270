"""OpenTelemetry traces of gateway requests (README, "Traces").

Off unless the site names a collector the OpenTelemetry way (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn
it off again). Off, every call here is a check of one module flag: the SDK is not even
imported. On, spans go to the collector over OTLP/HTTP in batches, from a thread of the SDK's.

A request is one trace: its server span (continuing the caller's W3C `traceparent`), with
children for what the gateway did (auth, the wait for a slot, an on-demand start and its
phases, the engine call), and the `traceparent` of the engine call passed to the engine, so
an engine that traces (vLLM with --otlp-traces-endpoint) adds its spans under it.

What a caller sends decides neither how much a span holds (a name or an attribute value is
cut to CAP characters) nor whether its request is traced: the site's sampling rule decides
that for each request (site_sampler), whatever the caller's `traceparent` says.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

ENABLED = False
# Whether a request's trace continues the caller's `traceparent` (its trace id; never its
# sampled flag, see site_sampler): MSHIP_TRACES_FOLLOW_CALLER. Off, each request starts a
# trace of its own, linked to the caller's.
FOLLOW_CALLER = os.environ.get("MSHIP_TRACES_FOLLOW_CALLER", "true").strip().lower() != "false"
_tracer: Any = None
_provider: Any = None
_NOTHING = contextlib.nullcontext()
# The longest span name or attribute value, in characters: a longer one (a path, a model's
# name, any value that came with a request) is cut to CAP, ending in CUT. 256 keeps whole
# every name and value of a request the gateway serves (a method and an endpoint, a model's
# or a deployment's name: at most 200, a key's prefix) and bounds what a caller can put in
# a span before it authenticates (a path of up to 64 KiB) to a few hundred bytes. (Not the
# SDK's SpanLimits: it would cut an exception event's stack trace as well, and unmarked.)
CAP = 256
CUT = "…[cut]"


def bounded(value: Any) -> Any:
    """A string of at most CAP characters (a longer one cut, ending in CUT); else `value`."""
    if isinstance(value, str) and len(value) > CAP:
        return value[: CAP - len(CUT)] + CUT
    return value


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
    # The site's rule (OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, as the SDK read them).
    _provider.sampler = site_sampler(_provider.sampler)
    exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    _provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=delay_ms))
    _tracer = _provider.get_tracer("modelship")
    ENABLED = True


def site_sampler(rule: Any) -> Any:
    """The site's sampling `rule`, deciding each request as a trace of its own: a caller's
    `traceparent` may name the trace its request continues, not whether it is sampled (its
    sampled flag forces nothing, nor does a trace id it chose low enough for a ratio; its
    unsampled flag hides nothing). The spans under a request's follow its decision."""
    from opentelemetry.sdk.trace.sampling import (  # noqa: PLC0415
        Decision,
        Sampler,
        SamplingResult,
    )
    from opentelemetry.trace import get_current_span  # noqa: PLC0415

    class SiteRule(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            parent = get_current_span(parent_context).get_span_context()
            if not parent.is_valid:  # a trace of the site's own: the rule, by its trace id
                decided: SamplingResult = rule.should_sample(
                    parent_context, trace_id, name, kind, attributes, links
                )
                return decided
            if not parent.is_remote:  # under a request's span: as that was decided
                sampled = parent.trace_flags.sampled
                decision = Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP
                return SamplingResult(decision, attributes if sampled else None, parent.trace_state)
            # A caller's: the rule as for a trace of no parent, drawn on a trace id of ours.
            draw = random.getrandbits(128) or 1
            decided = rule.should_sample(None, draw, name, kind, attributes, links)
            return SamplingResult(decided.decision, decided.attributes, parent.trace_state)

        def get_description(self) -> str:
            return f"SiteRule{{{rule.get_description()}}}"

    return SiteRule()


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
        name, attributes={k: bounded(v) for k, v in attributes.items()} or None
    )
    return started


def client_span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span of a call out of Modelship (an engine's), whose context the callee continues."""
    if not ENABLED:
        return _NOTHING
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    started: contextlib.AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, kind=SpanKind.CLIENT, attributes={k: bounded(v) for k, v in attributes.items()}
    )
    return started


@contextlib.contextmanager
def server_span(name: str, headers: Mapping[str, str]) -> Iterator[Any]:
    """The span of a request that arrived (`name` cut to CAP): under the caller's
    `traceparent`, or (not FOLLOW_CALLER) the root of a trace of its own, with a link to the
    caller's; sampled by the site's rule either way (site_sampler)."""
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
    named = bounded(name)
    with _tracer.start_as_current_span(named, context=context, kind=kind, links=links) as s:
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
