"""Images a Responses input names by URL, fetched by the gateway and handed to the engine
as data: URLs.

An engine that takes image URLs (vLLM) fetches them itself, from inside the engines'
network and with no policy: a caller could have it read a cloud's metadata endpoint or
another engine's admin routes. So no engine ever sees a caller's http(s) URL. The gateway
fetches each one under the MCP egress policy (openai_api/mcp/egress.py: the URL checked
before, every address checked at connect, no redirect followed, no proxy from the
environment), within MSHIP_INPUT_IMAGE_TIMEOUT_S and MSHIP_INPUT_IMAGE_MAX_BYTES for the
whole request, and only an image answer is taken; anything else is a 400 naming the part.
data: URLs pass as they are.

What is stored keeps the caller's URL (input_items lists what was sent); each turn that
uses it, a continuation too, fetches it again under the policy of that moment.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx2
from django.conf import settings

from openai_api.errors import GatewayError
from openai_api.mcp import egress
from openai_api.responses.image_urls import remote_parts

CODE = "invalid_image_url"


class Refused(GatewayError):
    def __init__(self, url: str, why: str, param: str) -> None:
        super().__init__(400, f"The image {url[:200]} cannot be used: {why}.", CODE, param=param)


async def fetch_images(
    items: list[dict[str, Any]], history: list[dict[str, Any]], earlier: str
) -> dict[str, str]:
    """Every remote image of a request's own items and of what it continues from, as data
    URLs by their URL. A refusal names the part (`input[i].content[j].image_url`) or, for an
    image of an earlier turn, the field that brought it (`earlier`)."""
    wanted: dict[str, str] = {}
    for index, number, part in remote_parts(items):
        wanted.setdefault(part["image_url"], f"input[{index}].content[{number}].image_url")
    for _, _, part in remote_parts(history):
        wanted.setdefault(part["image_url"], earlier)
    if not wanted:
        return {}
    policy = egress.current_policy()
    budget = [settings.MSHIP_INPUT_IMAGE_MAX_BYTES]
    fetched: dict[str, str] = {}
    try:
        async with (
            asyncio.timeout(settings.MSHIP_INPUT_IMAGE_TIMEOUT_S),
            egress.http_client({}, policy) as client,
        ):
            for url, param in wanted.items():
                fetched[url] = await fetch_one(client, policy, url, param, budget)
    except TimeoutError:
        url, param = next((u, p) for u, p in wanted.items() if u not in fetched)
        seconds = f"{settings.MSHIP_INPUT_IMAGE_TIMEOUT_S:g}"
        raise Refused(url, f"it did not arrive within {seconds} s", param) from None
    return fetched


async def fetch_one(
    client: httpx2.AsyncClient, policy: egress.Policy, url: str, param: str, budget: list[int]
) -> str:
    """One image as a data URL; what is left of the request's byte budget in `budget`."""

    def refuse(url: str, why: str) -> Exception:
        return Refused(url, why, param)

    await egress.check(url, policy, refuse)
    try:
        async with client.stream("GET", url, headers={"accept": "image/*"}) as answer:
            if answer.is_redirect:
                raise refuse(url, "it redirects, and redirects are not followed")
            if answer.status_code != 200:
                raise refuse(url, f"its server answered {answer.status_code}")
            kind = answer.headers.get("content-type", "").split(";")[0].strip().lower()
            if not kind.startswith("image/"):
                raise refuse(url, f"it is not an image ({kind or 'no content type'})")
            data = bytearray()
            async for chunk in answer.aiter_bytes():
                data += chunk
                if len(data) > budget[0]:
                    limit = settings.MSHIP_INPUT_IMAGE_MAX_BYTES
                    raise refuse(url, f"a request's images may be {limit} bytes in all")
    except egress.EgressRefused as exc:  # an address the URL check did not see (rebinding)
        raise refuse(url, str(exc)) from exc
    except httpx2.HTTPError as exc:
        raise refuse(url, f"it could not be fetched ({type(exc).__name__})") from exc
    budget[0] -= len(data)
    return f"data:{kind};base64,{base64.b64encode(bytes(data)).decode()}"
