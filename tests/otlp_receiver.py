"""An OTLP/HTTP trace receiver in the test's process, built on opentelemetry-proto: what a
collector would get from Modelship, as plain records."""

from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from deployments.runtimes.process import free_port
from tests.conftest import wait_until


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    service: str = ""
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each


def value_of(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/v1/traces":
                    receiver.take(body)
                    answer = ExportTraceServiceResponse().SerializeToString()
                    self.send_response(200)
                else:
                    answer = b""
                    self.send_response(404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", free_port("127.0.0.1")), Handler
        )
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: value_of(a.value) for a in s.attributes},
                            events=tuple(e.name for e in s.events),
                            links=tuple((k.trace_id.hex(), k.span_id.hex()) for k in s.links),
                            service=str(resource.get("service.name", "")),
                        )
                    )
        with self.lock:
            self.spans.extend(found)

    def named(self, name: str, trace_id: str) -> Span:
        """The one span of that name in a trace (waited for)."""

        def mine(span: Span) -> bool:
            return span.name == name and span.trace_id == trace_id

        wait_until(lambda: any(mine(s) for s in self.spans), 10)
        with self.lock:
            matches = [s for s in self.spans if mine(s)]
        assert len(matches) == 1, matches
        return matches[0]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
