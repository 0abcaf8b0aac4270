"""The Responses API's request side: what is accepted, what is refused with a 400, and how a
request becomes the engine's chat completion (input items become chat messages).

The engine only ever sees a flat chat request; conversation state (previous_response_id) is
resolved by the gateway before this runs and arrives here as earlier items.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from openai_api.responses import compaction
from openai_api.responses.fields import (
    bad,
    conversation_id,
    is_integer,
    is_number,
    metadata_of,
)
from openai_api.responses.image_urls import inlined
from openai_api.responses.input_items import input_items

HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "computer_use",
        "computer_use_preview",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
        "custom",
    }
)
PASSED_THROUGH = (
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "parallel_tool_calls",
    "user",
)
SERVICE_TIERS = frozenset({"auto", "default", "flex", "priority"})
# What the response echoes where the request gave nothing: the engines' own defaults.
DEFAULT_SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
}
TEXT_FORMATS = frozenset({"text", "json_schema", "json_object"})


@dataclass
class ResponsesRequest:
    """A checked request: the fields the envelope echoes and what the engine gets."""

    model: str
    input_items: list[dict[str, Any]]  # this request's own input, as items with ids
    instructions: str | None
    stream: bool
    store: bool
    background: bool
    previous_response_id: str | None
    conversation: str | None  # the conversation whose items it continues and extends
    tools: list[dict[str, Any]]
    tool_choice: Any
    parallel_tool_calls: bool
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]
    reasoning: dict[str, Any] | None
    metadata: dict[str, str]
    user: str | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    # The remote images of its context, fetched by the gateway (remote_images.py), by URL.
    images: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def uses_mcp(self) -> bool:
        """MCP servers among the tools: the gateway's MCP loop drives the response."""
        return any(tool.get("type") == "mcp" for tool in self.tools)


def parse(data: dict[str, Any]) -> ResponsesRequest:
    """Check a request body; 400 with the field's name for what cannot be served."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required.", "model")
    tools = data.get("tools") or []
    if not isinstance(tools, list):
        raise bad("'tools' must be a list.", "tools")
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in HOSTED_TOOLS:
            raise bad(
                f"The hosted tool {kind!r} is not available here: only function tools"
                " (and MCP servers by URL) can be used.",
                f"tools[{index}]",
            )
        if kind == "mcp":
            if tool.get("connector_id"):
                raise bad(
                    "OpenAI-hosted MCP connectors (connector_id) are not available here.",
                    f"tools[{index}].connector_id",
                )
            if not isinstance(tool.get("server_url"), str) or not isinstance(
                tool.get("server_label"), str
            ):
                raise bad("An MCP tool needs server_label and server_url.", f"tools[{index}]")
            check_mcp_tool(tool, f"tools[{index}]")
            continue
        if kind != "function" or not isinstance(tool.get("name"), str):
            raise bad(f"tools[{index}] must be a function tool with a name.", f"tools[{index}]")
    check_mcp_count(tools)
    tool_choice = data.get("tool_choice", "auto")
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "mcp":
        raise bad("tool_choice cannot force an MCP tool here.", "tool_choice")
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        names = {tool.get("name") for tool in tools if tool.get("type") == "function"}
        if tool_choice.get("name") not in names:
            raise bad(
                f"tool_choice forces the function {tool_choice.get('name')!r}, which is not"
                " among the tools.",
                "tool_choice",
            )
    for flag in ("stream", "background", "store"):
        if data.get(flag) is not None and not isinstance(data[flag], bool):
            raise bad(f"'{flag}' must be a boolean (true or false).", flag)
    store = data.get("store", True) is not False
    background = data.get("background") is True
    if background and not store:
        raise bad("background mode needs store: a background response must be pollable.", "store")
    max_output = data.get("max_output_tokens")
    if max_output is not None and (not is_integer(max_output) or max_output < 1):
        raise bad("'max_output_tokens' must be a positive integer.", "max_output_tokens")
    text = data.get("text") or {}
    if not isinstance(text, dict):
        raise bad("'text' must be an object.", "text")
    text_format = text.get("format")
    if text_format is not None and (
        not isinstance(text_format, dict) or text_format.get("type") not in TEXT_FORMATS
    ):
        raise bad(
            "'text.format' must be an object of type text, json_schema or json_object.",
            "text.format",
        )
    reasoning = data.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise bad("'reasoning' must be an object.", "reasoning")
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if data.get(name) is not None and not is_number(data[name]):
            raise bad(f"'{name}' must be a number.", name)
    top_logprobs = data.get("top_logprobs")
    if top_logprobs is not None and (not is_integer(top_logprobs) or not 0 <= top_logprobs <= 20):
        raise bad("'top_logprobs' must be an integer from 0 to 20.", "top_logprobs")
    for name in ("safety_identifier", "prompt_cache_key"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise bad(f"'{name}' must be a string.", name)
    tier = data.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise bad("'service_tier' is auto, default, flex or priority.", "service_tier")
    max_tool_calls = data.get("max_tool_calls")
    if max_tool_calls is not None and (not is_integer(max_tool_calls) or max_tool_calls < 1):
        raise bad("'max_tool_calls' must be a positive integer.", "max_tool_calls")
    if not isinstance(data.get("parallel_tool_calls", True), bool):
        raise bad("'parallel_tool_calls' must be a boolean.", "parallel_tool_calls")
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("'user' must be a string.", "user")
    metadata = metadata_of(data.get("metadata"))
    previous = data.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise bad("'previous_response_id' must be a string.", "previous_response_id")
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("'instructions' must be a string.", "instructions")
    conversation = conversation_id(data.get("conversation"))
    if conversation is not None and previous is not None:
        raise bad(
            "'conversation' and 'previous_response_id' cannot be used together.", "conversation"
        )
    return ResponsesRequest(
        model=model,
        input_items=input_items(data.get("input")),
        instructions=instructions,
        stream=data.get("stream") is True,
        store=store,
        background=background,
        previous_response_id=previous,
        conversation=conversation,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=data.get("parallel_tool_calls", True) is not False,
        max_output_tokens=max_output,
        temperature=data.get("temperature"),
        top_p=data.get("top_p"),
        text=text,
        reasoning=reasoning,
        metadata=metadata,
        user=user,
        raw=data,
    )


def check_mcp_count(tools: list[Any]) -> None:
    """At most MSHIP_MCP_MAX_SERVERS MCP servers: each is listed before any engine work."""
    cap = int(settings.MSHIP_MCP_MAX_SERVERS)
    servers = sum(1 for tool in tools if tool.get("type") == "mcp")
    if cap > 0 and servers > cap:
        raise bad(
            f"A request may list at most {cap} MCP servers among its tools; this one lists"
            f" {servers}.",
            "tools",
        )


def check_mcp_tool(tool: dict[str, Any], param: str) -> None:
    """The shapes of an MCP tool's filters and credentials."""
    approval = tool.get("require_approval", "always")
    if approval not in ("always", "never") and not (
        isinstance(approval, dict)
        and set(approval) <= {"always", "never"}
        and all(is_filter(f) for f in approval.values())
    ):
        raise bad(
            "require_approval must be 'always', 'never' or {always, never} tool filters.",
            f"{param}.require_approval",
        )
    allowed = tool.get("allowed_tools")
    if allowed is not None and not (
        is_filter(allowed)
        or (isinstance(allowed, list) and all(isinstance(n, str) for n in allowed))
    ):
        raise bad(
            "allowed_tools must be a list of names or a tool filter.", f"{param}.allowed_tools"
        )
    headers = tool.get("headers")
    if headers is not None and not isinstance(headers, dict):
        raise bad("headers must be an object.", f"{param}.headers")
    if tool.get("authorization") is not None and not isinstance(tool["authorization"], str):
        raise bad("authorization must be a string.", f"{param}.authorization")


def is_filter(value: Any) -> bool:
    """A tool filter: {tool_names: [str], read_only: bool}, either optional."""
    if not isinstance(value, dict) or not set(value) <= {"tool_names", "read_only"}:
        return False
    names = value.get("tool_names", [])
    read_only = value.get("read_only", False)
    return (
        isinstance(names, list)
        and all(isinstance(n, str) for n in names)
        and (isinstance(read_only, bool))
    )


def text_of(content: list[dict[str, Any]]) -> str:
    return "".join(
        str(part.get("text", ""))
        for part in content
        if part.get("type") in ("input_text", "output_text", "text")
    )


def chat_content(content: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's parts for a chat engine: its text as a string where that is all it has,
    else chat parts (text, image_url, file) in their order."""
    if not any(part.get("type") in ("input_image", "input_file") for part in content):
        return text_of(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image":
            image = {"url": part["image_url"], "detail": part.get("detail", "auto")}
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            file = {"file_data": part["file_data"], "filename": part.get("filename", "file")}
            parts.append({"type": "file", "file": file})
    return parts


def messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages for a conversation's items (earlier turns' outputs included)."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for item in compaction.expanded(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": chat_content(item.get("content") or [])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments", "{}")},
            }
            last = out[-1] if out else None
            if last and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        elif kind == "mcp_call":  # a call the gateway ran: the model saw it and its answer
            call_id = item.get("call_id") or item["id"]
            out += mcp_exchange(
                call_id, item["name"], item.get("arguments") or "{}", tool_text(item)
            )
    return out


def mcp_exchange(call_id: str, name: str, arguments: str, result: str) -> list[dict[str, Any]]:
    """The chat messages of one tool call and its result."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def tool_text(item: dict[str, Any]) -> str:
    """What the model is told an MCP call returned."""
    if item.get("error"):
        error = item["error"]
        if isinstance(error, str):
            return f"Error: {error}"
        detail = error.get("message") or json.dumps(error.get("content"))
        return f"Error: {detail}"
    return str(item.get("output") or "")


def chat_request(request: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's chat completion request, always streamed (with usage)."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages(
            request.instructions, inlined([*history, *request.input_items], request.images)
        ),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for key in PASSED_THROUGH:
        if request.raw.get(key) is not None:
            body[key] = request.raw[key]
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    if function_tools(request.tools):
        body["tools"] = function_tools(request.tools)
        choice = request.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        body["tool_choice"] = choice
    text_format = request.text.get("format") or {}
    if text_format.get("type") == "json_schema":
        schema = {k: text_format[k] for k in ("name", "schema", "strict") if k in text_format}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif text_format.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    effort = (request.reasoning or {}).get("effort")
    if effort:
        body["reasoning_effort"] = effort
    return body


def public_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the response echoes and stores it: an MCP server's credentials stay out; a
    function tool says whether it is strict (null: not said)."""
    if tool.get("type") == "function":
        return {**tool, "strict": tool.get("strict")}
    if tool.get("type") != "mcp":
        return tool
    return {k: v for k, v in tool.items() if k not in ("headers", "authorization")}


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools as chat completion tools."""
    keys = ("name", "description", "parameters", "strict")
    return [
        {"type": "function", "function": {k: tool[k] for k in keys if k in tool}}
        for tool in tools
        if tool.get("type") == "function"
    ]


def envelope(
    request: ResponsesRequest, response_id: str, created_at: int, status: str
) -> dict[str, Any]:
    """The response object before any output: what the request asked, echoed (a sampling
    setting the request left out as the API's default: a turn puts the values its deployment
    makes it with over temperature, top_p and max_output_tokens, made_with.py)."""
    raw = request.raw
    sampling = {name: raw.get(name, default) for name, default in DEFAULT_SAMPLING.items()}
    sampling = {name: DEFAULT_SAMPLING[name] if v is None else v for name, v in sampling.items()}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": None,
        "status": status,
        "background": request.background,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata,
        "model": request.model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "conversation": {"id": request.conversation} if request.conversation else None,
        "reasoning": request.reasoning,
        "store": request.store,
        "text": request.text or {"format": {"type": "text"}},
        "tool_choice": request.tool_choice,
        "tools": [public_tool(tool) for tool in request.tools],
        "truncation": "disabled",
        "usage": None,
        "user": request.user,
        "max_tool_calls": raw.get("max_tool_calls"),
        "safety_identifier": raw.get("safety_identifier"),
        "prompt_cache_key": raw.get("prompt_cache_key"),
        "service_tier": raw.get("service_tier") or "default",
        **sampling,
    }
