"""Image parts that name an http(s) URL, and the items as an engine gets them: each such
image replaced by the data URL the gateway fetched for it (remote_images.py). Pure, so the
request builders (protocol.py, engine_events.py, the MCP loop) use it without importing the
fetching side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openai_api.responses.fields import bad

if TYPE_CHECKING:
    from collections.abc import Iterator

REMOTE = ("http://", "https://")


def remote_parts(items: list[dict[str, Any]]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(item index, part index, part) of every image part that names an http(s) URL."""
    for index, item in enumerate(items):
        content = item.get("content") if item.get("type", "message") == "message" else None
        if not isinstance(content, list):
            continue
        for number, part in enumerate(content):
            if (
                isinstance(part, dict)
                and part.get("type") == "input_image"
                and isinstance(part.get("image_url"), str)
                and part["image_url"].startswith(REMOTE)
            ):
                yield index, number, part


def inlined(items: list[dict[str, Any]], fetched: dict[str, str]) -> list[dict[str, Any]]:
    """The items as the engine gets them: each remote image as its fetched data URL. A
    remote URL that was not fetched is refused, never passed on."""
    found = list(remote_parts(items))
    if not found:
        return items
    out = list(items)
    for index, number, part in found:
        url = part["image_url"]
        if url not in fetched:
            raise bad(f"The image {url[:200]} was not fetched.", "input")
        if out[index] is items[index]:
            out[index] = {**items[index], "content": list(items[index]["content"])}
        out[index]["content"][number] = {**part, "image_url": fetched[url]}
    return out
