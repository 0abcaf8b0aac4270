"""Answers to LiteLLM's health checks (`x-modelship-health-check: 1`), made by the gateway
itself: a probe takes no slot, starts nothing and is never forwarded, since the header is no
secret and a forwarded probe would run a generation the reaper cannot see.

The on-demand seed names the header `x-dgxmm-health-check` and the answer's state header
`x-dgxmm-ondemand-state`: a LiteLLM entry registered with the seed's marker is a probe too,
and every probe's answer carries both state headers.

The answer says the gateway and the deployment record are there, not that an engine serves:
a minimal, empty answer of the endpoint's shape."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from deployments.models import State
from openai_api.endpoints import ENDPOINTS
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from openai_api.catalog import Route

HEADER = "x-modelship-health-check"
SEED_HEADER = "x-dgxmm-health-check"  # the seed's name of it, accepted as ours
HEADERS = (HEADER, SEED_HEADER)
STATE_HEADERS = ("x-modelship-ondemand-state", "x-dgxmm-ondemand-state")


def asked(headers: dict[str, str]) -> bool:
    """Whether a request is a health probe (either name of the header set to 1)."""
    return any(headers.get(name, "").strip() == "1" for name in HEADERS)


def answer(endpoint: str, route: Route, streaming: bool) -> tuple[bytes, str]:
    """The body and its content type, or 503 where a probe gets no answer."""
    if route.state == State.FAILED:
        raise GatewayError(
            503, f"{route.name} failed; it serves nothing until it starts.", "ondemand_not_ready"
        )
    traits = ENDPOINTS.get(endpoint)
    body = _shape(endpoint, route.name, streaming) if traits is not None and traits.probe else None
    if body is None:
        raise GatewayError(
            503, f"Health checks are not answered on /v1/{endpoint}.", "ondemand_health_unsupported"
        )
    if streaming and traits is not None and traits.probe_streams:
        chunk = b"data: " + json.dumps(body).encode() + b"\n\n"
        return chunk + b"data: [DONE]\n\n", "text/event-stream"
    return json.dumps(body).encode(), "application/json"


def _shape(endpoint: str, name: str, streaming: bool) -> dict[str, Any] | None:
    created = int(time.time())
    ident = uuid.uuid4().hex
    if endpoint == "chat/completions":
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
        if streaming:
            choice["delta"] = {"role": "assistant", "content": ""}
        else:
            choice["message"] = {"role": "assistant", "content": ""}
        return {
            "id": f"chatcmpl-{ident}",
            "object": "chat.completion.chunk" if streaming else "chat.completion",
            "created": created,
            "model": name,
            "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    if endpoint == "completions":
        return {
            "id": f"cmpl-{ident}",
            "object": "text_completion",
            "created": created,
            "model": name,
            "choices": [{"index": 0, "text": "", "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    if endpoint == "embeddings":
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": []}],
            "model": name,
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }
    if endpoint == "responses":
        return {
            "id": f"resp_{ident}",
            "object": "response",
            "created_at": created,
            "status": "completed",
            "model": name,
            "output": [],
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        }
    if endpoint == "messages":
        return {
            "id": f"msg_{ident}",
            "type": "message",
            "role": "assistant",
            "model": name,
            "content": [],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
    return None
