"""What an engine's chat completions read differently from OpenAI's, said its way before
the body is sent (the public API stays OpenAI's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from openai_api.catalog import Route


def forced_name(choice: dict[str, Any]) -> Any:
    """The function a `tool_choice` object forces: chat's {"function": {"name"}} or the
    Responses API's flat {"name"}."""
    function = choice.get("function")
    return function.get("name") if isinstance(function, dict) else choice.get("name")


def chat_body(route: Route, body: dict[str, Any]) -> dict[str, Any]:
    """`body` for the route's engine. llama.cpp takes `tool_choice` as a word only (an
    object is logged as the wrong type and dropped): a forced function becomes "required"
    with that function the only one offered, which is what forcing it means."""
    choice = body.get("tool_choice")
    if route.names_forced_tool or not isinstance(choice, dict):
        return body
    name = forced_name(choice)
    tools = [
        tool
        for tool in body.get("tools") or []
        if isinstance(tool, dict)
        and isinstance(tool.get("function"), dict)
        and tool["function"].get("name") == name
    ]
    if not isinstance(name, str) or not tools:
        raise GatewayError(
            400,
            f"tool_choice forces the function {name!r}, which is not among the tools.",
            "invalid_value",
            param="tool_choice",
        )
    return {**body, "tools": tools, "tool_choice": "required"}
