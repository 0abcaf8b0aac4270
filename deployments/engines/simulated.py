"""The simulated engine: an OpenAI-compatible server that behaves like vLLM on the wire.

It serves chat, completions, embeddings, Anthropic messages, transcriptions, models, health,
Prometheus metrics (``vllm:num_requests_running`` / ``vllm:num_requests_waiting``) and vLLM's
sleep endpoints, with a configurable start-up delay, token rate, memory claim and injected
faults. It records requests whose client went away (``GET /sim/cancellations``) so tests can
prove that a hang-up reached the engine. It stands in for no real engine where one can run:
it serves tests, benchmarks and an operator's dry run.

Run: ``python -m deployments.engines.simulated --model sim --port 8001 --config '{...}'``
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from deployments.engines.common import (
    config_of,
    engine_app,
    error,
    json_body,
    parser,
    serve,
)
from deployments.engines.request_checks import problem

DEFAULT_REPLY = "This is a simulated reply from Modelship."


@dataclass
class SimConfig:
    startup_delay_s: float = 0.0
    tokens_per_second: float = 200.0
    reply: str = DEFAULT_REPLY
    echo: bool = False
    max_tokens: int | None = None
    reasoning: str | None = None
    tool_call: bool = False
    tool_name: str | None = None  # the tool to call when it is offered (else the first)
    tool_call_always: bool = False  # call it again even after a tool's answer came back
    tool_arguments: dict[str, Any] = field(default_factory=dict)
    memory_claim_gib: float = 0.0
    fail_at_start: bool = False
    crash_after_requests: int | None = None
    ignore_sigterm: bool = False
    embedding_dim: int = 16
    # Memory really allocated (and touched) at start, to meet a container's memory limit.
    allocate_mib: int = 0
    # Seconds before an inference request gets its answer's first byte (headers included).
    first_token_delay_s: float = 0.0

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
    served: int = 0
    sleeping: bool = False
    cancellations: list[dict[str, Any]] = field(default_factory=list)
    last_chat_request: dict[str, Any] | None = None
    last_chat_headers: dict[str, str] = field(default_factory=dict)


STATE = web.AppKey("state", SimState)


def tokens_for(state: SimState, body: dict[str, Any], prompt: str) -> list[str]:
    """The words to emit: the fixed reply or the echoed prompt, cycled up to max_tokens."""
    text = prompt if state.config.echo and prompt else state.config.reply
    words = text.split() or ["."]
    limit = body.get("max_tokens") or body.get("max_completion_tokens") or state.config.max_tokens
    count = len(words) if limit is None else max(0, int(limit))
    return [(" " if i else "") + words[i % len(words)] for i in range(count)]


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
        return await handler(request, request.app[STATE], body)

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


def usage(prompt: str, tokens: list[str]) -> dict[str, int]:
    prompt_tokens = max(1, len(prompt.split()))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(tokens),
        "total_tokens": prompt_tokens + len(tokens),
    }


@inference
async def chat_completions(
    request: web.Request, state: SimState, body: dict[str, Any]
) -> web.StreamResponse:
    prompt = last_user_text(body.get("messages", []))
    tokens = tokens_for(state, body, prompt)
    name = model_name(state, body)
    rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    tool = chosen_tool(state, body)
    tool_result = last_tool_result(state, body)
    if tool_result is not None:
        # A tool's answer came back: say it, in words.
        words = f"The tool said: {tool_result}".split()
        tokens = [(" " if i else "") + w for i, w in enumerate(words)]
    state.last_chat_request = body
    state.last_chat_headers = dict(request.headers)
    async with Inflight(state, request):
        if body.get("stream"):

            async def events() -> Any:
                def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                    return sse(
                        {
                            "id": rid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": name,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                        }
                    )

                yield chunk({"role": "assistant", "content": ""})
                if state.config.reasoning:
                    for word in state.config.reasoning.split():
                        await pace(state)
                        yield chunk({"reasoning_content": word + " "})
                if tool:
                    # The call's name first, its arguments in a second delta, as engines do.
                    call = tool_call_delta(tool, "")
                    yield chunk({"tool_calls": [call]})
                    arguments = json.dumps(state.config.tool_arguments)
                    yield chunk(
                        {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
                    )
                    yield chunk({}, "tool_calls")
                else:
                    for token in tokens:
                        await pace(state)
                        yield chunk({"content": token})
                    yield chunk({}, "length" if body.get("max_tokens") else "stop")
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield sse(
                        {
                            "id": rid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": name,
                            "choices": [],
                            "usage": usage(prompt, tokens),
                        }
                    )
                yield b"data: [DONE]\n\n"

            return await sse_stream(request, events())
        for _ in tokens:
            await pace(state)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(tokens)}
        finish = "length" if body.get("max_tokens") else "stop"
        if state.config.reasoning:
            message["reasoning_content"] = state.config.reasoning
        if tool:
            message["content"] = None
            message["tool_calls"] = [tool_call_delta(tool, json.dumps(state.config.tool_arguments))]
            message["tool_calls"][0].pop("index")
            finish = "tool_calls"
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage(prompt, tokens),
            }
        )


def tool_call_delta(tool: str, arguments: str) -> dict[str, Any]:
    return {
        "index": 0,
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": tool, "arguments": arguments},
    }


def chosen_tool(state: SimState, body: dict[str, Any]) -> str | None:
    """With `tool_call`, the tool to call when tools are offered (`tool_name`, else the
    first), unless the conversation ends with a tool's answer."""
    offered = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    if not state.config.tool_call or not offered or last_tool_result(state, body) is not None:
        return None
    wanted = state.config.tool_name
    return wanted if wanted in offered else offered[0]


def last_tool_result(state: SimState, body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    if state.config.tool_call_always:
        return None
    if state.config.tool_call and messages and messages[-1].get("role") == "tool":
        return str(messages[-1].get("content", ""))
    return None


@inference
async def responses(
    request: web.Request, state: SimState, body: dict[str, Any]
) -> web.StreamResponse:
    """/v1/responses, as vLLM serves it: the same words as a chat answer, in the Responses
    shape (the gateway's own translator builds it, fed the chunks a chat stream would have)."""
    from openai_api.errors import GatewayError
    from openai_api.responses import protocol
    from openai_api.responses.translator import StreamTranslator
    from openai_api.responses.translator import sse as event_sse

    try:
        parsed = protocol.parse(body)
    except GatewayError as exc:
        return error(exc.status, exc.message, exc.code)
    chat = protocol.chat_request(parsed, [])
    prompt = last_user_text(chat["messages"])
    tokens = tokens_for(state, chat, prompt)
    envelope = protocol.envelope(parsed, protocol.new_id("resp"), int(time.time()), "in_progress")
    translator = StreamTranslator(envelope)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    async def events() -> Any:
        yield translator.start()
        if state.config.reasoning:
            yield translator.feed(chunk({"reasoning_content": state.config.reasoning}))
        for token in tokens:
            await pace(state)
            yield translator.feed(chunk({"content": token}))
        translator.feed(chunk({}, "length" if chat.get("max_tokens") else "stop"))
        translator.feed({"choices": [], "usage": usage(prompt, tokens)})
        yield translator.finish()

    async with Inflight(state, request):
        if body.get("stream"):

            async def stream() -> Any:
                async for batch in events():
                    for event in batch:
                        yield event_sse(event)

            return await sse_stream(request, stream())
        async for _ in events():
            pass
        return web.json_response(translator.response)


@inference
async def completions(
    request: web.Request, state: SimState, body: dict[str, Any]
) -> web.StreamResponse:
    prompt = body.get("prompt", "")
    prompt = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    tokens = tokens_for(state, body, prompt)
    name = model_name(state, body)
    rid = f"cmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    async with Inflight(state, request):
        if body.get("stream"):

            async def events() -> Any:
                for token in tokens:
                    await pace(state)
                    yield sse(
                        {
                            "id": rid,
                            "object": "text_completion",
                            "created": created,
                            "model": name,
                            "choices": [{"index": 0, "text": token, "finish_reason": None}],
                        }
                    )
                yield b"data: [DONE]\n\n"

            return await sse_stream(request, events())
        for _ in tokens:
            await pace(state)
        return web.json_response(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": name,
                "choices": [{"index": 0, "text": "".join(tokens), "finish_reason": "stop"}],
                "usage": usage(prompt, tokens),
            }
        )


def embed(text: str, dim: int) -> list[float]:
    """A deterministic unit vector per text: identical inputs give identical vectors."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dim)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


@inference
async def embeddings(
    request: web.Request, state: SimState, body: dict[str, Any]
) -> web.StreamResponse:
    inputs = body.get("input", "")
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    async with Inflight(state, request):
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": embed(str(t), state.config.embedding_dim),
            }
            for i, t in enumerate(inputs)
        ]
        tokens = sum(len(str(t).split()) for t in inputs)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": model_name(state, body),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


@inference
async def messages(
    request: web.Request, state: SimState, body: dict[str, Any]
) -> web.StreamResponse:
    """Anthropic's messages API, as vLLM serves it."""
    prompt = last_user_text(body.get("messages", []))
    tokens = tokens_for(state, body, prompt)
    name = model_name(state, body)
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    in_tokens = max(1, len(prompt.split()))
    async with Inflight(state, request):
        if body.get("stream"):

            async def events() -> Any:
                start = {
                    "type": "message_start",
                    "message": {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": name,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": in_tokens, "output_tokens": 0},
                    },
                }
                yield sse(start, "message_start")
                block = {"type": "content_block_start", "index": 0}
                block["content_block"] = {"type": "text", "text": ""}
                yield sse(block, "content_block_start")
                for token in tokens:
                    await pace(state)
                    delta = {"type": "text_delta", "text": token}
                    yield sse(
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                        "content_block_delta",
                    )
                yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
                yield sse(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                        "usage": {"output_tokens": len(tokens)},
                    },
                    "message_delta",
                )
                yield sse({"type": "message_stop"}, "message_stop")

            return await sse_stream(request, events())
        for _ in tokens:
            await pace(state)
        return web.json_response(
            {
                "id": mid,
                "type": "message",
                "role": "assistant",
                "model": name,
                "content": [{"type": "text", "text": "".join(tokens)}],
                "stop_reason": "max_tokens",
                "stop_sequence": None,
                "usage": {"input_tokens": in_tokens, "output_tokens": len(tokens)},
            }
        )


async def transcriptions(request: web.Request) -> web.StreamResponse:
    """Answers with the upload's size and digest, so a test can see it arrived intact."""
    if (refused := guard(request)) is not None:
        return refused
    state = request.app[STATE]
    async with Inflight(state, request):
        form = await request.post()
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            return error(400, "A 'file' part is required.", "missing_file")
        content = upload.file.read()
        digest = hashlib.sha256(content).hexdigest()
        return web.json_response({"text": f"{len(content)} bytes sha256={digest}"})


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = state.served_names[0]
    claim = int(state.config.memory_claim_gib * 2**30)
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{model_name="{name}"}} {state.running}',
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{model_name="{name}"}} 0',
        "# TYPE modelship_sim_memory_bytes gauge",
        f"modelship_sim_memory_bytes {claim if not state.sleeping else 0}",
    ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def sleep(request: web.Request) -> web.Response:
    request.app[STATE].sleeping = True
    return web.Response(text="")


async def wake_up(request: web.Request) -> web.Response:
    request.app[STATE].sleeping = False
    return web.Response(text="")


async def is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": request.app[STATE].sleeping})


async def cancellations(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"count": len(state.cancellations), "cancelled": state.cancellations})


async def last_chat_request(request: web.Request) -> web.Response:
    """The body of the last chat completion request, as the engine received it."""
    return web.json_response(request.app[STATE].last_chat_request)


async def stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"served": state.served, "running": state.running, "pid": os.getpid()})


async def last_chat_headers(request: web.Request) -> web.Response:
    """The headers of the last chat completion request, as the engine received them."""
    return web.json_response(request.app[STATE].last_chat_headers)


def make_app(config: SimConfig, served_names: list[str]) -> web.Application:
    routes = [
        web.post("/v1/chat/completions", chat_completions),
        web.post("/v1/completions", completions),
        web.post("/v1/embeddings", embeddings),
        web.post("/v1/messages", messages),
        web.post("/v1/responses", responses),
        web.post("/v1/audio/transcriptions", transcriptions),
        web.post("/v1/audio/translations", transcriptions),
        web.get("/metrics", metrics),
        web.post("/sleep", sleep),
        web.post("/wake_up", wake_up),
        web.get("/is_sleeping", is_sleeping),
        web.get("/sim/cancellations", cancellations),
        web.get("/sim/stats", stats),
        web.get("/sim/last_chat_request", last_chat_request),
        web.get("/sim/last_chat_headers", last_chat_headers),
    ]
    app = engine_app(served_names, routes, owner="simulated", client_max_size=64 * 2**20)
    app[STATE] = SimState(config=config, served_names=served_names)
    return app


def main(argv: list[str] | None = None) -> None:
    args = parser("simulated-engine").parse_args(argv)
    config = SimConfig.from_dict(config_of(args.config))
    if config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"simulated engine: loading {args.model}", flush=True)
    time.sleep(config.startup_delay_s)
    ballast = bytearray(config.allocate_mib * 2**20)
    for offset in range(0, len(ballast), 4096):
        ballast[offset] = 1  # touch every page, so it is resident
    if config.fail_at_start:
        print("simulated engine: RuntimeError: injected start failure", file=sys.stderr)
        raise SystemExit(1)
    names = args.served_model_name or [args.model]
    print(f"simulated engine: serving {names} on {args.host}:{args.port}", flush=True)
    serve(make_app(config, names), args.host, args.port, handle_signals=not config.ignore_sigterm)


if __name__ == "__main__":
    main()
