"""One MCP server for the length of a response: its tools listed once, then called, over
streamable HTTP with the official `mcp` SDK.

The tool's `headers` and `authorization` go to the server and nowhere else (they are not
stored with the response, and never logged)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from dataclasses import dataclass, field
from typing import Any

import httpx2

from openai_api.mcp import egress

CALL_TIMEOUT_S = 60.0
MAX_OUTPUT_BYTES = 2**20
MAX_EVENT_BYTES = 32 * 2**20  # what the server may send; the output is cut to 1 MiB after
SDK = "mcp.client.streamable_http"  # what a session needs of the MCP SDK
TRUNCATED = "\n…[output truncated at 1 MiB]"


class McpFailure(Exception):
    """The server could not be reached or refused; `error` is the mcp_call error object."""

    def __init__(self, message: str, error: dict[str, Any]) -> None:
        super().__init__(message)
        self.error = error


@dataclass
class McpTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None


@dataclass
class McpServer:
    """A request's `{"type": "mcp", ...}` tool."""

    label: str
    url: str
    headers: dict[str, str] = field(repr=False, default_factory=dict)
    allowed_tools: Any = None
    require_approval: Any = "always"

    @classmethod
    def of(cls, tool: dict[str, Any]) -> McpServer:
        headers = {str(k): str(v) for k, v in (tool.get("headers") or {}).items()}
        if tool.get("authorization"):
            headers["Authorization"] = f"Bearer {tool['authorization']}"
        return cls(
            label=str(tool["server_label"]),
            url=str(tool["server_url"]),
            headers=headers,
            allowed_tools=tool.get("allowed_tools"),
            require_approval=tool.get("require_approval", "always"),
        )

    def allows(self, tool: McpTool) -> bool:
        allowed = self.allowed_tools
        if allowed is None:
            return True
        if isinstance(allowed, list):
            return tool.name in allowed
        return not allowed or matches(allowed, tool)

    def needs_approval(self, tool: McpTool) -> bool:
        """OpenAI's meaning: "never" runs every tool unasked, "always" (the default) asks
        for every one; a filter object asks for the tools its `always` filter matches, not for
        those its `never` filter matches, and, the safe default, for a tool neither matches."""
        rule = self.require_approval
        if rule == "never":
            return False
        if not isinstance(rule, dict):
            return True
        if isinstance(rule.get("always"), dict) and matches(rule["always"], tool):
            return True
        return not (isinstance(rule.get("never"), dict) and matches(rule["never"], tool))


def matches(tool_filter: dict[str, Any], tool: McpTool) -> bool:
    """Whether a tool filter (`tool_names`, `read_only`) names this tool."""
    names = tool_filter.get("tool_names")
    if names is not None and tool.name not in names:
        return False
    if tool_filter.get("read_only"):
        return bool((tool.annotations or {}).get("readOnlyHint"))
    return names is not None or "read_only" in tool_filter


class Connection:
    """One server for the length of a response. Each operation opens its own MCP session
    (initialize, then the request) inside one coroutine, so the SDK's task groups are
    entered and left in the same task whatever fails."""

    def __init__(self, server: McpServer) -> None:
        self.server = server

    @contextlib.asynccontextmanager
    async def _session(self) -> Any:
        # The SDK (a second or so of CPU to load) only where a response calls MCP tools, not
        # at every gateway process's start; loaded in a thread, not on the event loop.
        if SDK not in sys.modules:
            await asyncio.to_thread(importlib.import_module, SDK)
        from mcp import ClientSession  # noqa: PLC0415
        from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

        async with (
            egress.http_client(self.server.headers) as http,
            streamable_http_client(
                self.server.url, http_client=http, max_sse_event_size=MAX_EVENT_BYTES
            ) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session

    async def open(self) -> list[McpTool]:
        """The server's tools. No deadline of its own: its caller's, one for all of a
        request's servers (MSHIP_MCP_LIST_TIMEOUT_S, loop.list_tools), cancels it."""
        try:
            async with self._session() as session:
                listed = await session.list_tools()
        except Exception as exc:  # unreachable, not MCP, timed out: all the same to the model
            raise McpFailure(describe(exc), http_error(exc)) from exc
        return [
            McpTool(
                name=t.name,
                description=t.description or "",
                input_schema=dict(t.input_schema or {"type": "object"}),
                annotations=t.annotations.model_dump() if t.annotations else None,
            )
            for t in listed.tools
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The tool's text output (truncated at 1 MiB); McpFailure with its error."""
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S), self._session() as session:
                result = await session.call_tool(name, arguments)
        except TimeoutError as exc:
            message = f"the tool {name} did not answer within {CALL_TIMEOUT_S:g} s"
            error = {"type": "http_error", "code": 504, "message": message}
            raise McpFailure(message, error) from exc
        except Exception as exc:
            raise McpFailure(describe(exc), http_error(exc)) from exc
        text = "".join(getattr(part, "text", "") for part in result.content)
        if result.is_error:
            error = {
                "type": "mcp_tool_execution_error",
                "content": [{"type": "text", "text": text}],
            }
            raise McpFailure(text or f"the tool {name} failed", error)
        return truncate(text)


def truncate(text: str) -> str:
    raw = text.encode()
    if len(raw) <= MAX_OUTPUT_BYTES:
        return text
    return raw[:MAX_OUTPUT_BYTES].decode(errors="ignore") + TRUNCATED


def describe(exc: BaseException) -> str:
    """The first real cause inside the SDK's task-group exception groups. A failure to
    connect is told in one sentence whatever its cause, so the caller cannot map which
    ports are open (refused, reset and timed out all read the same)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.TransportError | OSError):
        return "the MCP server could not be reached"
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__


def http_error(exc: BaseException) -> dict[str, Any]:
    return {"type": "http_error", "code": 502, "message": describe(exc)}
