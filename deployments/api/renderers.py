"""Renderers of the API's answers beyond JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rest_framework.renderers import BaseRenderer

if TYPE_CHECKING:
    from collections.abc import Mapping


class EventStreamRenderer(BaseRenderer):
    """Accepts `Accept: text/event-stream` (a browser's EventSource sends only that) for the
    endpoints that stream server-sent events; the stream itself is their own. What goes
    through here is a refusal before the stream, sent as one `error` event."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        return f"event: error\ndata: {json.dumps(data)}\n\n".encode()
