"""The simulated engine's core: its options, its state, and the plumbing every route shares
(pacing, in-flight counting and faults, the JSON-route wrapper, SSE)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from deployments.engines.common import error, json_body
from deployments.engines.request_checks import problem

DEFAULT_REPLY = "This is a simulated reply from Modelship."


@dataclass
class SimConfig:
    startup_delay_s: float = 0.0
    tokens_per_second: float = 200.0
    reply: str = DEFAULT_REPLY
    echo: bool = False
    max_tokens: int | None = None  # the length of an answer whose request names none
    # The sampling of a request that sets none: it samples nothing, but says what it used.
    temperature: float = 1.0
    top_p: float = 1.0
    # The most tokens a request may ask for: more is a 400, as vLLM answers a request past
    # its context length.
    max_output_tokens: int = 32768
    reasoning: str | None = None
    tool_call: bool = False
    tool_name: str | None = None  # the tool to call when it is offered (else the first)
    tool_call_always: bool = False  # call it again even after a tool's answer came back
    tool_arguments: dict[str, Any] = field(default_factory=dict)
    memory_claim_gib: float = 0.0
    fail_at_start: bool = False
    needs_gib: float = 0.0
    out_of_memory: str = "cuda"
    crash_after_requests: int | None = None
    ignore_sigterm: bool = False
    embedding_dim: int = 16
    # Memory really allocated (and touched) at start, to meet a container's memory limit.
    allocate_mib: int = 0
    # Seconds before an inference request gets its answer's first byte (headers included).
    first_token_delay_s: float = 0.0
    # Every inference request is answered with this HTTP status (after the delay above).
    fail_status: int | None = None
    vision: bool = False  # it stands in for a model that takes images (the loader says so)
    # It sleeps (vLLM's sleep mode on a GPU); with ignore_sleep it takes a /sleep and stays
    # awake, as vLLM's CPU worker does.
    enable_sleep_mode: bool = False
    ignore_sleep: bool = False
    # It fetches its weights into the model cache (HF_HOME) at start, as vLLM does from the
    # Hub, unless they are there already; /sim/env says which it was.
    download: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise SystemExit(f"simulated engine: unknown options {sorted(unknown)}")
        return cls(**data)


@dataclass
class SimState:
    config: SimConfig
    served_names: list[str]
    started_at: float = field(default_factory=time.time)
    running: int = 0
    peak_running: int = 0  # the most requests it ran at once (tests read the limits by it)
    served: int = 0
    sleeping: bool = False
    sleep_level: int = 0  # the level of its last /sleep
    # Woken from level 2 (weights discarded) and not reloaded yet: it answers nothing, as a
    # vLLM engine that was not given /collective_rpc reload_weights answers nonsense.
    weights_dropped: bool = False
    cancellations: list[dict[str, Any]] = field(default_factory=list)
    last_chat_request: dict[str, Any] | None = None
    last_responses_request: dict[str, Any] | None = None
    last_chat_headers: dict[str, str] = field(default_factory=dict)
    weights: str = ""  # "downloaded" or "cached", with the download option


STATE = web.AppKey("state", SimState)


def tokens_for(state: SimState, body: dict[str, Any], prompt: str) -> Reply:
    """The words to emit: the fixed reply or the echoed prompt, cycled up to max_tokens. An
    answer cut by its engine's own limit (`max_tokens`, or `max_output_tokens` below what it
    would say) says so: it stopped at its length."""
    text = prompt if state.config.echo and prompt else state.config.reply
    words = text.split() or ["."]
    asked = body.get("max_tokens") or body.get("max_completion_tokens")
    limit = asked or state.config.max_tokens
    count = len(words) if limit is None else max(0, int(limit))
    cap = state.config.max_output_tokens
    cut = (not asked and state.config.max_tokens is not None) or count > cap
    return Reply(words, min(count, cap), cut)


class Reply(Collection[str]):
    """An answer's tokens, each made as it is sent: a long answer is never held whole
    (a request for 2**31 tokens once grew the engine until the OOM killer stopped it)."""

    def __init__(self, words: list[str], count: int, cut: bool = False) -> None:
        self.words = words
        self.count = count
        self.cut = cut  # ended by the engine's own limit, not the request's

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        words = self.words
        for i in range(self.count):
            yield (" " if i else "") + words[i % len(words)]

    def __contains__(self, token: object) -> bool:
        return any(token == t for t in self)


def over_the_cap(config: SimConfig, body: dict[str, Any]) -> str | None:
    """Why a request asks for more tokens than the engine makes, or None."""
    cap = config.max_output_tokens
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
            return (
                f"{name} is too large: {value}. This model supports at most {cap} completion"
                f" tokens, whereas you provided {value}."
            )
    return None


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def model_name(state: SimState, body: dict[str, Any]) -> str:
    requested = body.get("model")
    return requested if requested in state.served_names else state.served_names[0]


async def pace(state: SimState) -> None:
    rate = state.config.tokens_per_second
    if rate > 0:
        await asyncio.sleep(1.0 / rate)


class Inflight:
    """Counts a request as running, notes a hang-up, and applies the crash-after fault."""

    def __init__(self, state: SimState, request: web.Request) -> None:
        self.state = state
        self.request = request

    async def __aenter__(self) -> Inflight:
        self.state.running += 1
        self.state.peak_running = max(self.state.peak_running, self.state.running)
        # An access line per inference request, so an operator's log shows the traffic.
        print(f"{self.request.method} {self.request.path}", flush=True)
        if self.state.config.first_token_delay_s:
            await asyncio.sleep(self.state.config.first_token_delay_s)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.state.running -= 1
        if exc_type is not None and issubclass(
            exc_type, asyncio.CancelledError | ConnectionResetError
        ):
            self.state.cancellations.append(
                {
                    "path": self.request.path,
                    "request_id": self.request.headers.get("X-Request-Id", ""),
                    "at": time.time(),
                }
            )
            return
        self.state.served += 1
        crash_after = self.state.config.crash_after_requests
        if crash_after is not None and self.state.served >= crash_after:
            # Exit after the answer is on its way, like an engine dying between requests.
            asyncio.get_running_loop().call_later(0.05, os._exit, 3)


def guard(request: web.Request) -> web.Response | None:
    state = request.app[STATE]
    if state.sleeping:
        return error(503, "The engine is sleeping.", "engine_sleeping", "server_error")
    return None


JsonHandler = Callable[[web.Request, SimState, dict[str, Any]], Awaitable[web.StreamResponse]]


def inference(handler: JsonHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An inference route with a JSON body: refused while asleep, bad JSON answered 400."""

    async def route(request: web.Request) -> web.StreamResponse:
        if (refused := guard(request)) is not None:
            return refused
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        found = problem(request.path, body)
        if found is not None:
            return error(400, found[1], "invalid_request")
        state = request.app[STATE]
        if (too_many := over_the_cap(state.config, body)) is not None:
            return error(400, too_many, "invalid_value")
        if state.weights_dropped:
            message = "Its weights were discarded by a level 2 sleep and never reloaded."
            return error(500, message, "weights_not_loaded", "server_error")
        if state.config.fail_status is not None:
            async with Inflight(state, request):
                message = "The simulated engine failed as it was told to."
                return error(state.config.fail_status, message, "engine_error", "server_error")
        return await handler(request, state, body)

    return route


async def sse_stream(request: web.Request, events: Any) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    async for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def sse(data: Any, event: str | None = None) -> bytes:
    prefix = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"{prefix}data: {payload}\n\n".encode()


def usage(prompt: str, tokens: Collection[str]) -> dict[str, int]:
    prompt_tokens = max(1, len(prompt.split()))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(tokens),
        "total_tokens": prompt_tokens + len(tokens),
    }
