"""What an engine's chat completions read differently from OpenAI's, said its way before
the body is sent (the public API stays OpenAI's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openai_api.auth import current_key
from openai_api.cache_scope import with_cache_salt
from openai_api.catalog import catalog
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from openai_api.catalog import Route


def forced_name(choice: dict[str, Any]) -> Any:
    """The function a `tool_choice` object forces: chat's {"function": {"name"}} or the
    Responses API's flat {"name"}."""
    function = choice.get("function")
    return function.get("name") if isinstance(function, dict) else choice.get("name")


def adapter_body(route: Route, body: dict[str, Any]) -> dict[str, Any]:
    """`body` as its route's engine takes it: a vLLM adapter by its name; for llama.cpp, a
    caller's own `lora` never passed on (a key for a base would reach every adapter loaded
    in it). A llama.cpp adapter's own `lora` is set once its engine is known (`with_lora`).
    And its class where the engine schedules by it (`with_priority`), and its tenant's cache
    salt where the engine keeps tenants' caches apart by one (openai_api/cache_scope.py)."""
    if route.adapter is not None and route.adapter.runtime:
        body = {**body, "model": route.name}  # vLLM serves a loaded adapter by its name
    elif route.loader == "llama_server" and "lora" in body:
        body = {k: v for k, v in body.items() if k != "lora"}
    return with_priority(route, with_cache_salt(route, body))


def with_priority(route: Route, body: dict[str, Any]) -> dict[str, Any]:
    """A caller's own `priority` never reaches an engine (it would jump the engine's queue
    past the classes the site set); where the engine orders requests by priority (vLLM's
    `scheduling_policy: priority`), the request's class goes instead: its key's plus its
    deployment's (common/priority.py), said vLLM's way, where a lower number goes first."""
    if route.engine_priority:
        key = current_key.get()
        return {**body, "priority": -(route.priority + (key.priority if key else 0))}
    if "priority" in body:
        return {k: v for k, v in body.items() if k != "priority"}
    return body


def needs_lora(route: Route) -> bool:
    return route.adapter is not None and not route.adapter.runtime


def with_lora(route: Route, base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A llama.cpp adapter's request for the engine at `base_url`: its place in the --lora
    list that engine started with (read from the route table as it is now: an on-demand
    base may have started since the request came), at scale 1. An engine that lacks it (a
    base started before the adapter was added, being replaced) is a 503, never the base's
    answer under the adapter's name."""
    current = catalog.snapshot.routes.get(route.name) if catalog.snapshot else None
    loaded = dict((current or route).loras).get(base_url, ())
    if route.name not in loaded:
        raise GatewayError(
            503,
            f"The adapter {route.name} is not loaded in its base's engine yet (the base is"
            " being started or replaced with it); try again shortly.",
            "adapter_not_loaded",
            {"retry-after": "5"},
        )
    return {**body, "lora": [{"id": loaded.index(route.name), "scale": 1.0}]}


def with_slot(body: bytes, slot: int) -> bytes:
    """A llama.cpp request pinned to its engine's `slot` (openai_api/routing/slots.py):
    `id_slot` last in the object, where the engine's reading of a key said twice takes it
    over any the caller sent."""
    end = body.rstrip()
    if not end.endswith(b"}"):
        return body
    inner = end[:-1].rstrip()
    return inner + (b"" if inner.endswith(b"{") else b",") + b'"id_slot":%d}' % slot


def chat_body(route: Route, body: dict[str, Any]) -> dict[str, Any]:
    """`body` for the route's engine (and its adapter, `adapter_body`). llama.cpp takes
    `tool_choice` as a word only (an object is logged as the wrong type and dropped): a
    forced function becomes "required" with that function the only one offered, which is
    what forcing it means, and a choice of allowed tools becomes its mode with only those
    tools offered."""
    body = adapter_body(route, body)
    choice = body.get("tool_choice")
    if route.names_forced_tool or not isinstance(choice, dict):
        return body
    if choice.get("type") == "function":
        name = forced_name(choice)
        names = {name} if isinstance(name, str) else set()
        return {**body, "tools": offered(body, names, name), "tool_choice": "required"}
    if choice.get("type") == "allowed_tools":
        # Chat nests the choice under "allowed_tools"; the Responses API has it flat.
        nested = choice.get("allowed_tools")
        spec = nested if isinstance(nested, dict) else choice
        mode, listed = spec.get("mode"), spec.get("tools")
        if mode not in ("auto", "required") or not isinstance(listed, list):
            raise GatewayError(
                400,
                'tool_choice of allowed tools needs a mode ("auto" or "required") and tools.',
                "invalid_value",
                param="tool_choice",
            )
        names = {
            name
            for tool in listed
            if isinstance(tool, dict) and isinstance(name := forced_name(tool), str)
        }
        return {**body, "tools": offered(body, names, sorted(names)), "tool_choice": mode}
    return body


def offered(body: dict[str, Any], names: set[str], named: Any) -> list[dict[str, Any]]:
    """The request's function tools of those names; a 400 where there are none."""
    tools = [
        tool
        for tool in body.get("tools") or []
        if isinstance(tool, dict)
        and isinstance(tool.get("function"), dict)
        and tool["function"].get("name") in names
    ]
    if not tools:
        raise GatewayError(
            400,
            f"tool_choice names {named!r}, which is not among the tools.",
            "invalid_value",
            param="tool_choice",
        )
    return tools
