"""POST /v1/responses/input_tokens: how many tokens a Responses request's input is, counted
by the engine's own tokenizer over the chat the engine would be sent (instructions, earlier
turns of `previous_response_id`, the input), so a client can size a request before it sends
it. vLLM counts a chat in one call (/tokenize); llama.cpp applies its chat template, then
tokenizes the prompt. An engine with no tokenizer is a 400.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aiohttp

from deployments.loaders import get_loader
from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError
from openai_api.forwarder import engine_error_of, forwarder, unreachable
from openai_api.responses import protocol, store
from openai_api.responses.remote_images import fetch_images

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.exchange import Exchange


def no_tokenizer(route: Route) -> GatewayError:
    return GatewayError(
        400,
        f"The model {route.name!r} ({route.loader}, {route.usecase}) cannot count tokens.",
        "unsupported_endpoint",
        param="model",
    )


async def count(exchange: Exchange, route: Route, identity: str, data: dict[str, Any]) -> None:
    tokenizer = get_loader(route.loader).tokenizer
    if tokenizer is None or "chat/completions" not in route.endpoints:
        raise no_tokenizer(route)
    request = protocol.parse(data)
    history = await store.earlier_items(identity, request)
    earlier = "conversation" if request.conversation else "previous_response_id"
    request.images = await fetch_images(request.input_items, history, earlier)
    chat = protocol.chat_request(request, history)
    async with dispatcher.slot(route) as base_url:
        tokens = await engine_count(base_url, route.name, tokenizer, chat)
    body = {"object": "response.input_tokens", "input_tokens": tokens}
    await exchange.json(200, json.dumps(body).encode())


async def engine_count(base_url: str, name: str, tokenizer: str, chat: dict[str, Any]) -> int:
    async with forwarder.using(base_url) as session:
        try:
            if tokenizer == "vllm":
                body = {"model": chat["model"], "messages": chat["messages"]}
                if chat.get("tools"):
                    body["tools"] = chat["tools"]
                answer = await call(session, base_url + "/tokenize", body)
                return int(answer["count"])
            templated = await call(
                session, base_url + "/apply-template", {"messages": chat["messages"]}
            )
            tokenized = await call(
                session, base_url + "/tokenize", {"content": templated["prompt"]}
            )
            return len(tokenized["tokens"])
        except aiohttp.ClientError as exc:
            raise GatewayError(502, unreachable(exc, name), "upstream_error") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise GatewayError(
                502, f"The engine of {name} answered no token count.", "upstream_error"
            ) from exc


async def call(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as answer:
        if answer.status != 200:
            message, code = await engine_error_of(answer)
            raise GatewayError(answer.status, message, code or "upstream_error")
        return await answer.json(content_type=None)
