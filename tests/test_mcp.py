"""Server-side MCP tools in the Responses API: a real MCP server (the `mcp` SDK's MCPServer
over streamable HTTP) started here, the simulated engine calling its tools on cue, and the
official openai SDK as the client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer

from deployments.runtimes.process import free_port
from openai_api.models import StoredResponse
from tests.conftest import wait_until
from tests.open_responses_schema import conforming_sdk
from tests.ws_support import until_done

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")

SEEN_HEADERS: list[dict[str, str]] = []


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    """A real MCP server with a few tools: one plain, one slow, one that fails, one secret
    (the tests ask for approval of it)."""
    server = MCPServer("dice")

    @server.tool()
    def roll(sides: int = 6) -> str:
        """Roll a die with this many sides (deterministic here)."""
        return f"rolled {sides}"

    @server.tool()
    async def slow() -> str:
        """Takes a moment."""
        await asyncio.sleep(0.3)
        return "slow done"

    @server.tool()
    def broken() -> str:
        """Always fails."""
        raise ValueError("the dice fell off the table")

    @server.tool()
    def big() -> str:
        """Says a lot."""
        return "x" * (2 * 2**20)

    @server.tool()
    def secret() -> str:
        """Reads a secret."""
        return "the secret is 42"

    app = server.streamable_http_app()

    async def recording(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            SEEN_HEADERS.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    port = free_port("127.0.0.1")
    config = uvicorn.Config(recording, host="127.0.0.1", port=port, log_level="warning")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    wait_until(lambda: runner.started, 30)
    yield f"http://127.0.0.1:{port}/mcp"
    runner.should_exit = True
    thread.join(10)


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str], site: Any) -> openai.OpenAI:
    site.MSHIP_MCP_ALLOWED_HOSTS = ["127.0.0.1"]  # the test's MCP server is on loopback
    return conforming_sdk(gateway_url, api_key())  # the schema, checked


def dice(url: str, **extra: Any) -> Any:
    return {"type": "mcp", "server_label": "dice", "server_url": url, **extra}


def model(serving: Callable[..., Deployment], tool: str, **config: Any) -> Deployment:
    return serving(
        "sim",
        config={"tool_call": True, "tool_name": tool, "tool_arguments": {"sides": 20}, **config},
    )


def test_it_runs_the_tool_and_answers_with_its_result(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "roll")
    answer = client.responses.create(
        model="sim", input="Roll a d20", tools=[dice(mcp_url, require_approval="never")]
    )
    assert answer.status == "completed"
    assert [item.type for item in answer.output] == ["mcp_list_tools", "mcp_call", "message"]
    listed, call, _ = answer.output
    assert {t.name for t in listed.tools} == {"roll", "slow", "broken", "big", "secret"}  # type: ignore[union-attr]
    assert (call.name, call.arguments, call.output) == ("roll", '{"sides": 20}', "rolled 20")  # type: ignore[union-attr]
    assert answer.output_text == "The tool said: rolled 20"


def test_it_streams_one_response_across_turns(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "slow")
    tools: list[Any] = [dice(mcp_url, require_approval="never", allowed_tools=["slow"])]
    with client.responses.stream(model="sim", input="Go slow", tools=tools) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == list(range(len(final.output)))  # output indexes only grow
    expected = [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_text.delta",
    ]
    assert [k for k in kinds if k in expected and k in set(expected)][:6] == expected[:6]
    assert final.output[0].tools[0].name == "slow"  # type: ignore[union-attr]  # allowed_tools
    assert final.output_text == "The tool said: slow done"


def test_it_reports_a_failed_tool_call_and_lets_the_model_answer(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "broken")
    with client.responses.stream(
        model="sim", input="x", tools=[dice(mcp_url, require_approval="never")]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.mcp_call.failed" in kinds
    call = final.output[1]
    assert call.type == "mcp_call" and call.error is not None and call.output is None
    assert final.status == "completed" and final.output_text.startswith("The tool said: Error")


def test_it_asks_for_approval_and_runs_the_call_once_approved(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "secret")
    rule = {"always": {"tool_names": ["secret"]}}
    tools: list[Any] = [dice(mcp_url, require_approval=rule)]
    asked = client.responses.create(model="sim", input="Tell me the secret", tools=tools)
    assert [i.type for i in asked.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = asked.output[1]
    approval: list[Any] = [
        {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    ]
    done = client.responses.create(
        model="sim", input=approval, tools=tools, previous_response_id=asked.id
    )
    call = next(i for i in done.output if i.type == "mcp_call")
    assert call.approval_request_id == request.id and call.output == "the secret is 42"
    assert done.output_text == "The tool said: the secret is 42"
    # The same approval again, or one for a request nobody made: refused.
    for forged in (request.id, "mcpr_forged"):
        body: list[Any] = [{**approval[0], "approval_request_id": forged}]
        with pytest.raises(openai.BadRequestError):
            client.responses.create(
                model="sim", input=body, tools=tools, previous_response_id=done.id
            )


def test_it_fails_cleanly_when_the_server_cannot_be_reached(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = model(serving, "roll")
    gone = f"http://127.0.0.1:{free_port('127.0.0.1')}/mcp"
    with client.responses.stream(
        model="sim", input="x", tools=[dice(gone, require_approval="never")]
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert "response.mcp_list_tools.failed" in kinds
    assert kinds[-2:] == ["error", "response.failed"]
    # One sentence whatever the cause: a caller cannot tell a closed port from a filtered one.
    message = events[-2].message  # type: ignore[union-attr]
    assert message.endswith("the MCP server could not be reached") and "refused" not in message
    sim.refresh_from_db()

    assert httpx.get(sim.engine_url + "/sim/stats").json()["served"] == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/mcp",
        "http://metadata.google.internal/mcp",
        "http://2852039166/mcp",  # 169.254.169.254 as one number: resolved, then refused
        "http://[::ffff:169.254.169.254]/mcp",
        "file:///etc/passwd",
    ],
)
def test_it_refuses_cloud_metadata_endpoints(
    client: openai.OpenAI, serving: Callable[..., Deployment], url: str
) -> None:
    model(serving, "roll")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim", input="x", tools=[dice(url)])
    assert refused.value.code == "mcp_egress_refused"


def test_it_keeps_to_the_allow_list_and_https_when_told(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str, site: Any
) -> None:
    model(serving, "roll")
    site.MSHIP_MCP_ALLOWED_HOSTS = []
    with pytest.raises(openai.BadRequestError) as loopback:  # refused unless named
        client.responses.create(model="sim", input="x", tools=[dice(mcp_url)])
    assert "loopback" in loopback.value.message
    site.MSHIP_MCP_ALLOWED_HOSTS = ["tools.internal"]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="sim", input="x", tools=[dice(mcp_url)])
    site.MSHIP_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    site.MSHIP_MCP_REQUIRE_HTTPS = True
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="sim", input="x", tools=[dice(mcp_url)])


def test_it_sends_the_tools_credentials_but_never_stores_them(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "roll")
    SEEN_HEADERS.clear()
    tool = dice(mcp_url, require_approval="never", headers={"X-Team": "t-77"})
    tool["authorization"] = "mcp-token-123"
    answer = client.responses.create(model="sim", input="x", tools=[tool])
    assert answer.output_text == "The tool said: rolled 20"
    assert any(
        h.get("authorization") == "Bearer mcp-token-123" and h.get("x-team") == "t-77"
        for h in SEEN_HEADERS
    )
    stored = json.dumps(StoredResponse.objects.get(pk=answer.id).response)
    assert "mcp-token-123" not in stored and "t-77" not in stored
    assert "mcp-token-123" not in json.dumps(client.responses.retrieve(answer.id).model_dump())


def test_it_runs_mcp_tools_in_the_background(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "roll")
    queued = client.responses.create(
        model="sim",
        input="x",
        tools=[dice(mcp_url, require_approval="never")],
        background=True,
    )
    found: list[Any] = []

    def finished() -> bool:
        found[:] = [client.responses.retrieve(queued.id)]
        return bool(found[0].status == "completed")

    wait_until(finished, 30)
    assert found[0].output_text == "The tool said: rolled 20"


def test_it_stops_at_the_turn_limit_and_at_max_tool_calls(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "roll", tool_call_always=True)  # a model that never stops calling
    tools: list[Any] = [dice(mcp_url, require_approval="never")]
    endless = client.responses.create(model="sim", input="x", tools=tools)
    calls = [i for i in endless.output if i.type == "mcp_call"]
    assert len(calls) == 10 and endless.status == "completed"
    capped = client.responses.create(model="sim", input="x", tools=tools, max_tool_calls=2)
    assert len([i for i in capped.output if i.type == "mcp_call"]) == 2


def test_it_hands_calls_of_the_clients_own_tools_back(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "lookup")
    mine: Any = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    answer = client.responses.create(
        model="sim", input="x", tools=[dice(mcp_url, require_approval="never"), mine]
    )
    assert [i.type for i in answer.output] == ["mcp_list_tools", "function_call"]
    assert answer.output[1].name == "lookup"  # type: ignore[union-attr]


def test_it_truncates_a_tools_output_at_one_mib(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "big")
    answer = client.responses.create(
        model="sim", input="x", tools=[dice(mcp_url, require_approval="never")], max_tool_calls=1
    )
    call = answer.output[1]
    assert call.type == "mcp_call" and call.output is not None
    assert len(call.output.encode()) < 2**20 + 100 and call.output.endswith("truncated at 1 MiB]")


@pytest.mark.parametrize(
    ("rule", "asks"),
    [
        ("never", False),
        ("always", True),
        ({"never": {"tool_names": ["roll"]}}, False),
        ({"never": {"tool_names": ["secret"]}}, True),  # roll is in neither list: it asks
        ({"always": {"tool_names": ["secret"]}}, True),
        ({"always": {"tool_names": ["roll"]}}, True),
        ({"always": {"tool_names": ["secret"]}, "never": {"tool_names": ["roll"]}}, False),
    ],
)
def test_it_asks_for_approval_as_the_require_approval_rule_says(
    client: openai.OpenAI,
    serving: Callable[..., Deployment],
    mcp_url: str,
    rule: Any,
    asks: bool,
) -> None:
    model(serving, "roll")
    answer = client.responses.create(
        model="sim", input="Roll", tools=[dice(mcp_url, require_approval=rule)]
    )
    kinds = [item.type for item in answer.output]
    if asks:
        assert kinds == ["mcp_list_tools", "mcp_approval_request"]
    else:
        assert kinds == ["mcp_list_tools", "mcp_call", "message"]


def test_it_never_follows_an_mcp_servers_redirect(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    """A server that answers with a redirect to another address (a canary here) gets the
    call failed; the canary never hears of it."""
    canary_hits: list[str] = []

    async def canary(scope: dict[str, Any], receive: Any, send: Any) -> None:
        canary_hits.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    with asgi_server(canary) as canary_url:

        async def redirector(scope: dict[str, Any], receive: Any, send: Any) -> None:
            location = (canary_url + "/mcp").encode()
            headers = [(b"location", location), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 307, "headers": headers})
            await send({"type": "http.response.body", "body": b""})

        with asgi_server(redirector) as redirecting_url:
            model(serving, "roll")
            tool = dice(redirecting_url + "/mcp", require_approval="never")
            with client.responses.stream(model="sim", input="x", tools=[tool]) as stream:
                kinds = [event.type for event in stream]
    assert "response.mcp_list_tools.failed" in kinds and kinds[-1] == "response.failed"
    assert canary_hits == []


@contextlib.contextmanager
def asgi_server(app: Any, lifespan: str = "off") -> Iterator[str]:
    port = free_port("127.0.0.1")
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan=lifespan,  # type: ignore[arg-type]
    )
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    wait_until(lambda: runner.started, 30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        runner.should_exit = True
        thread.join(10)


def test_it_runs_mcp_tools_for_a_response_over_a_websocket(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str
) -> None:
    model(serving, "roll")
    with client.responses.connect() as connection:
        connection.response.create(
            model="sim", input="Roll a d20", tools=[dice(mcp_url, require_approval="never")]
        )
        events = until_done(connection)
    kinds = [e["type"] for e in events]
    assert "response.mcp_call.completed" in kinds and kinds[-1] == "response.completed"
    response = events[-1]["response"]
    assert [item["type"] for item in response["output"]] == [
        "mcp_list_tools",
        "mcp_call",
        "message",
    ]
    assert client.responses.retrieve(response["id"]).output_text == "The tool said: rolled 20"


def test_it_refuses_more_mcp_servers_than_a_request_may_list(
    client: openai.OpenAI, serving: Callable[..., Deployment], mcp_url: str, site: Any
) -> None:
    model(serving, "roll")
    site.MSHIP_MCP_MAX_SERVERS = 2
    SEEN_HEADERS.clear()
    tools: list[Any] = [
        {**dice(mcp_url, require_approval="never"), "server_label": f"dice{n}"} for n in range(3)
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim", input="x", tools=tools)
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"]) == ("invalid_request_error", "tools")
    assert "at most 2 MCP servers" in error["message"]
    assert SEEN_HEADERS == []  # refused up front: no server was asked
    answer = client.responses.create(model="sim", input="x", tools=tools[:2])  # at the cap
    assert answer.status == "completed"


@contextlib.contextmanager
def stalling_mcp_server(seconds: float) -> Iterator[str]:
    """A real MCP server whose tools/list answers only after `seconds` (or at the end)."""
    server = MCPServer("stalls")

    @server.tool()
    def idle() -> str:
        """Does nothing."""
        return "idle"

    app = server.streamable_http_app()
    done = threading.Event()

    async def stalling(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        if b'"tools/list"' in b"".join(m.get("body", b"") for m in messages):
            await asyncio.to_thread(done.wait, seconds)
        replay = iter(messages)

        async def again() -> Any:
            return next(replay, None) or await receive()

        return await app(scope, again, send)

    with asgi_server(stalling, lifespan="on") as url:
        try:
            yield url + "/mcp"
        finally:
            done.set()


def test_it_lists_all_mcp_servers_within_one_deadline(
    client: openai.OpenAI, serving: Callable[..., Deployment], site: Any
) -> None:
    """Three servers that each stall 5 s on tools/list, one deadline of 1 s for them all:
    the response fails after about 1 s, not after 3 x 5 s (nor 3 x 30 s as each once had)."""
    model(serving, "roll")
    site.MSHIP_MCP_LIST_TIMEOUT_S = 1
    with stalling_mcp_server(5) as url:
        tools: list[Any] = [
            {"type": "mcp", "server_label": f"slow{n}", "server_url": url} for n in range(3)
        ]
        began = time.monotonic()
        with client.responses.stream(model="sim", input="x", tools=tools) as stream:
            events = list(stream)
        took = time.monotonic() - began
    kinds = [e.type for e in events]
    assert "response.mcp_list_tools.failed" in kinds
    assert kinds[-2:] == ["error", "response.failed"]
    message = events[-2].message  # type: ignore[union-attr]
    assert "'slow0'" in message and "not listed in time" in message
    assert took < 4, took
