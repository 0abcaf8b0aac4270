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

import hashlib
import json
import math
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from deployments.engines import sim_sleep
from deployments.engines.common import (
    config_of,
    engine_app,
    error,
    json_body,
    parser,
    serve,
)
from deployments.engines.sim_core import (
    STATE,
    Inflight,
    Reply,
    SimConfig,
    SimState,
    guard,
    inference,
    last_user_text,
    model_name,
    pace,
    sse,
    sse_stream,
    tokens_for,
    usage,
)
from deployments.engines.sim_responses import responses


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
        tokens = Reply(words, len(words))
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
                    yield chunk({}, "length" if body.get("max_tokens") or tokens.cut else "stop")
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
        finish = "length" if body.get("max_tokens") or tokens.cut else "stop"
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
    """The tool to call, as a model would: the one `tool_choice` forces (a function by
    name, or any with "required"); else, with `tool_call`, the configured one when offered
    (`tool_name`, else the first), unless the conversation ends with a tool's answer or
    `tool_choice` is "none"."""
    offered = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    choice = body.get("tool_choice", "auto")
    if not offered or choice == "none":
        return None
    if isinstance(choice, dict):  # {"type": "function", "function": {"name": ...}}
        forced = (choice.get("function") or {}).get("name") or choice.get("name")
        return forced if forced in offered else None
    wanted = state.config.tool_name
    configured = wanted if wanted in offered else offered[0]
    if choice == "required":
        return configured
    if not state.config.tool_call or last_tool_result(state, body) is not None:
        return None
    return configured


def last_tool_result(state: SimState, body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    if state.config.tool_call_always:
        return None
    if state.config.tool_call and messages and messages[-1].get("role") == "tool":
        return str(messages[-1].get("content", ""))
    return None


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
        # OpenAI's usage of a transcription: the audio's seconds (as 16 kHz 16-bit mono).
        seconds = {"type": "duration", "seconds": round(len(content) / 32000, 3)}
        return web.json_response(
            {"text": f"{len(content)} bytes sha256={digest}", "usage": seconds}
        )


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


async def cancellations(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"count": len(state.cancellations), "cancelled": state.cancellations})


async def last_chat_request(request: web.Request) -> web.Response:
    """The body of the last chat completion request, as the engine received it."""
    return web.json_response(request.app[STATE].last_chat_request)


async def last_responses_request(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].last_responses_request)


async def stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response(
        {
            "served": state.served,
            "running": state.running,
            "peak_running": state.peak_running,
            "pid": os.getpid(),
            "sleep_level": state.sleep_level,
        }
    )


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's /tokenize: a prompt or a chat's messages, counted (a word is a token here)."""
    body = await json_body(request)
    if isinstance(body, web.Response):
        return body
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        messages = body.get("messages")
        if not isinstance(messages, list):
            return error(400, "Give a prompt or messages.", "invalid_request")
        prompt = " ".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))
    tokens = list(range(len(prompt.split())))
    return web.json_response({"count": len(tokens), "max_model_len": 32768, "tokens": tokens})


async def last_chat_headers(request: web.Request) -> web.Response:
    """The headers of the last chat completion request, as the engine received them."""
    return web.json_response(request.app[STATE].last_chat_headers)


async def environment(request: web.Request) -> web.Response:
    """What the engine was given: its GPUs, the model cache, and where its weights came from."""
    names = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_HOME")
    found: dict[str, Any] = {name: os.environ.get(name) for name in names}
    found["has_hf_token"] = bool(os.environ.get("HF_TOKEN"))
    found["weights"] = request.app[STATE].weights
    return web.json_response(found)


def fetch_weights(model: str) -> str:
    """The download option: the model's files in the cache, fetched (made) unless present."""
    folder = Path(os.environ.get("HF_HOME") or ".") / "hub" / f"models--{model.replace('/', '--')}"
    weights = folder / "model.safetensors"
    if weights.exists():
        return "cached"
    folder.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(os.urandom(4096))
    return "downloaded"


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
        web.post("/sleep", sim_sleep.sleep),
        web.post("/wake_up", sim_sleep.wake_up),
        web.post("/collective_rpc", sim_sleep.collective_rpc),
        web.post("/reset_prefix_cache", sim_sleep.reset_prefix_cache),
        web.get("/is_sleeping", sim_sleep.is_sleeping),
        web.get("/sim/cancellations", cancellations),
        web.get("/sim/stats", stats),
        web.get("/sim/env", environment),
        web.get("/sim/last_chat_request", last_chat_request),
        web.get("/sim/last_responses_request", last_responses_request),
        web.get("/sim/last_chat_headers", last_chat_headers),
        web.post("/tokenize", tokenize),
    ]
    app = engine_app(served_names, routes, owner="simulated", client_max_size=64 * 2**20)
    app[STATE] = SimState(config=config, served_names=served_names)
    return app


def main(argv: list[str] | None = None) -> None:
    cli = parser("simulated-engine")
    cli.add_argument("--memory-gib", type=float, default=None, help="the memory it is given")
    args = cli.parse_args(argv)
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
    if args.memory_gib is not None and args.memory_gib < config.needs_gib:
        print(
            sim_sleep.OUT_OF_MEMORY[config.out_of_memory](config.needs_gib - args.memory_gib),
            file=sys.stderr,
        )
        raise SystemExit(1)
    # What it needs, it holds (as an engine's weights and cache are): its footprint, measured.
    held = bytearray(max(0, int(config.needs_gib * 2**30) - len(ballast)))
    for offset in range(0, len(held), 4096):
        held[offset] = 1
    names = args.served_model_name or [args.model]
    app = make_app(config, names)
    if config.download:
        app[STATE].weights = fetch_weights(args.model)
        print(f"simulated engine: weights {app[STATE].weights}", flush=True)
    print(f"simulated engine: serving {names} on {args.host}:{args.port}", flush=True)
    serve(app, args.host, args.port, handle_signals=not config.ignore_sigterm)


if __name__ == "__main__":
    main()
