"""The Responses API on /v1/responses, with the official openai SDK against the simulated
engine (which can emit reasoning and tool-call deltas): built from the engine's chat
completions, streamed as the Responses event protocol, stored in the gateway."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.db import connection
from django.utils import timezone

from deployments.runtimes.process import free_port
from openai_api.models import StoredResponse
from openai_api.responses import replay
from openai_api.tasks import sweep_responses
from tests.conftest import REPO, answers, env_for_subprocess, wait_until
from tests.gateway_support import seen_by_gateway
from tests.open_responses_schema import check_event, conforming_sdk

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")


def sdk(gateway_url: str, key: str) -> openai.OpenAI:
    """The SDK, with every Responses body and event it receives checked against the Open
    Responses schema (tests/open_responses_schema.py)."""
    return conforming_sdk(gateway_url, key)


def last_chat_request(deployment: Deployment) -> dict[str, Any]:
    """What the engine was sent for the last turn."""
    deployment.refresh_from_db()
    body: dict[str, Any] = httpx.get(deployment.engine_url + "/sim/last_chat_request").json()
    return body


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return sdk(gateway_url, api_key())


@pytest.mark.sample("responses")
def test_it_answers_text_and_stores_it(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "Paris is the capital"})
    answer = client.responses.create(
        model="sim", input="Capital of France?", instructions="Be brief.", metadata={"k": "v"}
    )
    assert answer.id.startswith("resp_") and answer.status == "completed"
    assert answer.output_text == "Paris is the capital"
    [message] = answer.output
    assert message.type == "message" and message.role == "assistant"
    assert answer.usage is not None and answer.usage.output_tokens == 4
    assert answer.usage.total_tokens == answer.usage.input_tokens + 4
    assert (answer.instructions, answer.metadata) == ("Be brief.", {"k": "v"})
    again = client.responses.retrieve(answer.id)
    assert again.model_dump() == answer.model_dump()
    client.responses.delete(answer.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answer.id)


def test_it_streams_the_event_protocol_in_order(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "one two three", "reasoning": "let me think"})
    with client.responses.stream(model="sim", input="count") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    reasoning = "".join(
        e.delta for e in events if e.type == "response.reasoning_summary_text.delta"
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (reasoning.strip(), text) == ("let me think", "one two three")
    # Reasoning opened first (output 0), the message second; each closed once.
    added = [
        (e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"
    ]
    done = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.done"]
    assert added == done == [(0, "reasoning"), (1, "message")]
    assert final.output_text == "one two three"
    assert final.output[0].type == "reasoning"
    assert client.responses.retrieve(final.id).output_text == "one two three"


def test_it_round_trips_a_function_call_with_previous_response_id(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"tool_call": True})
    tools: list[Any] = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    first = client.responses.create(model="sim", input="Weather in Oslo?", tools=tools)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert last_chat_request(sim)["tools"][0]["function"]["name"] == "get_weather"
    second = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert second.output_text == "The tool said: sunny"
    sent = last_chat_request(sim)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == call.call_id
    assert sent[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}


@pytest.mark.sample("responses")
def test_it_chains_three_turns_and_branches_from_an_earlier_one(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"echo": True})
    one = client.responses.create(model="sim", input="first")
    two = client.responses.create(model="sim", input="second", previous_response_id=one.id)
    three = client.responses.create(model="sim", input="third", previous_response_id=two.id)
    assert three.output_text == "third" and three.previous_response_id == two.id
    sent = last_chat_request(sim)["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "first"),
        ("assistant", "first"),
        ("user", "second"),
        ("assistant", "second"),
        ("user", "third"),
    ]
    branch = client.responses.create(model="sim", input="other", previous_response_id=one.id)
    assert branch.output_text == "other"
    sent = last_chat_request(sim)["messages"]
    assert [m["content"] for m in sent] == ["first", "first", "other"]
    # The input items of the third turn: every input up to it, newest first by default.
    items = client.responses.input_items.list(three.id)
    assert texts(items.data) == ["third", "second", "second", "first", "first"]


def test_it_passes_responses_to_an_engines_own_and_keeps_the_state_itself(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    """`responses: engine`: the engine's /v1/responses answers (vLLM's own implementation;
    the simulated engine serves it as vLLM does), given the whole context and nothing to
    store; Modelship keeps the ids, the chain and the stored responses."""
    native = serving("native", responses="engine", config={"echo": True})

    def sent() -> dict[str, Any]:
        native.refresh_from_db()
        body: dict[str, Any] = httpx.get(native.engine_url + "/sim/last_responses_request").json()
        return body

    one = client.responses.create(model="native", input="first", instructions="Be brief.")
    assert one.id.startswith("resp_") and one.output_text == "first"
    assert one.instructions == "Be brief." and one.usage is not None
    assert (sent()["store"], sent()["stream"], sent()["instructions"]) == (False, True, "Be brief.")
    assert httpx.get(native.engine_url + "/sim/last_chat_request").json() is None  # no chat
    two = client.responses.create(model="native", input="second", previous_response_id=one.id)
    assert two.output_text == "second" and two.previous_response_id == one.id
    context = sent()["input"]
    assert "previous_response_id" not in sent()
    assert [(item.get("role"), item["content"][0]["text"]) for item in context] == [
        ("user", "first"),
        ("assistant", "first"),
        ("user", "second"),
    ]
    assert client.responses.retrieve(two.id).output_text == "second"
    assert texts(client.responses.input_items.list(two.id).data) == ["second", "first", "first"]

    # Streamed: the engine's events, renumbered, between Modelship's opening and end.
    with client.responses.stream(model="native", input="three words here") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and kinds.count("response.created") == 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == "three words here"
    assert client.responses.retrieve(final.id).output_text == "three words here"
    queued = client.responses.create(model="native", input="in the background", background=True)
    assert wait_for_status(client, queued.id, "completed").output_text == "in the background"

    # MCP tools are Modelship's own loop: refused, naming the field.
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="native",
            input="x",
            tools=[{"type": "mcp", "server_label": "s", "server_url": "http://127.0.0.1:1/"}],
        )
    assert refused.value.param == "tools" and "responses: engine" in refused.value.message


@pytest.mark.sample("responses")
def test_it_pages_input_items_both_ways(
    client: openai.OpenAI, serving: Callable[..., Deployment], gateway_url: str
) -> None:
    serving("sim")
    inputs: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    answer = client.responses.create(model="sim", input=inputs)
    page = client.responses.input_items.list(answer.id, order="asc", limit=2)
    assert texts(page.data) == ["m0", "m1"] and page.has_more
    assert page.model_extra and page.model_extra["last_id"] == page.data[-1].id
    every = client.responses.input_items.list(answer.id, order="asc", limit=2)
    assert texts(every) == ["m0", "m1", "m2", "m3", "m4"]  # the SDK follows `after` to the end
    newest = client.responses.input_items.list(answer.id, order="desc", limit=3)
    assert texts(newest.data) == ["m4", "m3", "m2"]
    rest = client.responses.input_items.list(answer.id, order="desc", after=newest.data[-1].id)
    assert texts(rest.data) == ["m1", "m0"] and not rest.has_more
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(answer.id, limit=101)


def test_it_keeps_each_callers_responses_to_itself(
    serving: Callable[..., Deployment], gateway_url: str, api_key: Callable[..., str]
) -> None:
    serving("sim")
    alice, bob = sdk(gateway_url, api_key("alice")), sdk(gateway_url, api_key("bob"))
    mine = alice.responses.create(model="sim", input="secret")
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="sim", input="x", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(mine.id)
    assert alice.responses.retrieve(mine.id).output_text


def test_it_says_incomplete_when_the_engine_stops_on_max_output_tokens(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim")
    answer = client.responses.create(model="sim", input="x", max_output_tokens=3)
    assert answer.status == "incomplete"
    assert answer.incomplete_details is not None
    assert answer.incomplete_details.reason == "max_output_tokens"
    with client.responses.stream(model="sim", input="x", max_output_tokens=3) as stream:
        kinds = [e.type for e in stream]
    assert kinds[-1] == "response.incomplete"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"tools": [{"type": "web_search"}]}, "hosted tool"),
        ({"tools": [{"type": "mcp", "server_label": "x", "connector_id": "c"}]}, "connector"),
        ({"tool_choice": {"type": "mcp", "server_label": "x"}}, "MCP"),
        ({"background": True, "store": False}, "background"),
        ({"input": 5}, "input"),
        # A string is no boolean: "yes" (or "false") is refused, never taken as true.
        ({"stream": "yes"}, "'stream' must be a boolean"),
        ({"store": "no"}, "'store' must be a boolean"),
        ({"background": 1}, "'background' must be a boolean"),
        ({"tool_choice": {"type": "function", "name": "roll"}}, "not among the tools"),
        ({"previous_response_id": "resp_nope"}, None),
    ],
)
def test_it_refuses_what_it_cannot_serve_before_calling_the_engine(
    client: openai.OpenAI, serving: Callable[..., Deployment], extra: dict[str, Any], says: str
) -> None:
    sim = serving("sim")
    body: dict[str, Any] = {"model": "sim", "input": "x", **extra}
    with pytest.raises(openai.APIStatusError) as refused:
        client.post("/responses", body=body, cast_to=httpx.Response)
    if says is None:
        assert refused.value.status_code == 404
    else:
        assert refused.value.status_code == 400 and says in refused.value.message
    assert engine_stats(sim)["served"] == 0


def texts(items: Any) -> list[str]:
    """The text of each message item of a page (or of all pages, iterated)."""
    return [i.content[0].text for i in items if i.type == "message"]


def engine_url(deployment: Deployment) -> str:
    deployment.refresh_from_db()
    return deployment.engine_url


def test_it_answers_404_for_a_deployment_that_does_not_chat(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("vectors", usecase="embed")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="vectors", input="x")


# --- background runs ------------------------------------------------------------------------


def wait_for_status(client: openai.OpenAI, response_id: str, *statuses: str) -> Any:
    found: list[Any] = []

    def reached() -> bool:
        found[:] = [client.responses.retrieve(response_id)]
        return found[0].status in statuses

    wait_until(reached, 30)
    return found[0]


@pytest.mark.redis
def test_it_runs_a_background_response_and_is_polled_to_completion(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "done in the background", "tokens_per_second": 20})
    queued = client.responses.create(model="sim", input="x", background=True)
    assert queued.status == "queued" and queued.background
    finished = wait_for_status(client, queued.id, "completed")
    assert finished.output_text == "done in the background"
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(client.responses.create(model="sim", input="y").id)


@pytest.mark.redis
def test_it_cancels_a_background_run_and_the_engine_sees_it(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "slow " * 50, "tokens_per_second": 5})
    queued = client.responses.create(model="sim", input="x", background=True)
    wait_until(lambda: engine_stats(sim)["running"] == 1, 10)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert client.responses.cancel(queued.id).status == "cancelled"  # idempotent
    wait_until(lambda: cancellations(sim) == 1, 10)
    assert client.responses.retrieve(queued.id).status == "cancelled"  # never undone


@pytest.mark.redis
def test_it_deletes_a_background_run_in_flight(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "slow " * 50, "tokens_per_second": 5})
    queued = client.responses.create(model="sim", input="x", background=True)
    wait_until(lambda: engine_stats(sim)["running"] == 1, 10)
    client.responses.delete(queued.id)
    wait_until(lambda: cancellations(sim) == 1, 10)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(queued.id)


@pytest.mark.redis
def test_it_resumes_a_background_stream_from_any_sequence_number(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "a b c d e f g h", "tokens_per_second": 40})
    first: list[Any] = []
    stream = client.responses.create(model="sim", input="x", background=True, stream=True)
    for event in stream:
        first.append(event)
        if event.type == "response.output_text.delta":
            break  # the client goes away mid-stream
    stream.close()
    response_id = first[0].response.id
    cursor = first[-1].sequence_number
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=cursor))
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[0].response.status == "queued"
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "a b c d e f g h"
    # The SDK's stream helper resumes the same way, from a later cursor.
    with client.responses.stream(response_id=response_id, starting_after=cursor + 2) as again:
        tail = [e.sequence_number for e in again]
    assert tail == list(range(cursor + 3, len(events)))
    assert wait_for_status(client, response_id, "completed").output_text == text


@pytest.mark.redis
def test_it_reports_a_background_run_whose_process_died_as_failed(
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
    site: Any,
    tmp_path: Path,
) -> None:
    """The run lives in another gateway process, killed mid-run: its heartbeat stops, and
    a poll through this gateway reports the response failed."""
    sim = serving("sim", config={"reply": "slow " * 50, "tokens_per_second": 5})
    key = api_key()
    port = free_port("127.0.0.1")
    other = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "modelship_site.asgi:application"),
            *("--port", str(port), "--log-level", "warning", "--lifespan", "off"),
        ],
        cwd=REPO,
        env=env_for_subprocess(MSHIP_RESPONSES_HEARTBEAT_S="0.2", MSHIP_VAR_DIR=str(tmp_path)),
    )
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), 30)
        there = sdk(f"http://127.0.0.1:{port}", key)
        queued = there.responses.create(model="sim", input="x", background=True)
        wait_until(lambda: engine_stats(sim)["running"] == 1, 10)
    finally:
        other.kill()
        other.wait()
    site.MSHIP_RESPONSES_HEARTBEAT_STALE_S = 1.0
    here = sdk(gateway_url, key)
    lost = wait_for_status(here, queued.id, "failed")
    assert lost.error is not None and lost.error.code == "background_run_lost"


# --- the store unavailable --------------------------------------------------------------------


@pytest.mark.postgres
def test_it_answers_503_before_any_engine_work_when_the_store_is_unavailable(
    client: openai.OpenAI, serving: Callable[..., Deployment], site: Any
) -> None:

    sim = serving("sim")
    earlier = client.responses.create(model="sim", input="x")
    served = engine_stats(sim)["served"]
    # Redis gone: a streamed background run cannot keep its replay log.
    site.REDIS_URL = f"redis://127.0.0.1:{free_port('127.0.0.1')}/0"
    with pytest.raises(openai.InternalServerError) as refused:
        client.responses.create(model="sim", input="x", background=True, stream=True)
    assert refused.value.status_code == 503 and refused.value.code == "store_unavailable"
    # The database's table gone: history cannot be read.
    with connection.schema_editor() as editor:
        editor.delete_model(StoredResponse)
    try:
        with pytest.raises(openai.InternalServerError) as refused:
            client.responses.create(model="sim", input="y", previous_response_id=earlier.id)
        assert refused.value.status_code == 503
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(StoredResponse)
    assert engine_stats(sim)["served"] == served  # the engine was never called


def engine_stats(deployment: Deployment) -> dict[str, Any]:
    return dict(httpx.get(engine_url(deployment) + "/sim/stats").json())


def cancellations(deployment: Deployment) -> int:
    return int(httpx.get(engine_url(deployment) + "/sim/cancellations").json()["count"])


def test_it_forgets_responses_after_their_ttl(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:

    serving("sim")
    old = client.responses.create(model="sim", input="old")
    kept = client.responses.create(model="sim", input="kept")
    StoredResponse.objects.filter(pk=old.id).update(expires_at=timezone.now())
    with pytest.raises(openai.NotFoundError):  # expired: gone at once, swept or not
        client.responses.retrieve(old.id)
    assert sweep_responses() == 1
    assert list(StoredResponse.objects.values_list("id", flat=True)) == [kept.id]


# --- failures mid-stream, and on demand -------------------------------------------------------


@pytest.mark.parametrize("responses", ["gateway", "engine"])
def test_it_fails_the_response_when_the_engine_dies_mid_stream(
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
    responses: str,
) -> None:
    """Translated from the engine's chat stream, or its own Responses events passed on."""
    sim = serving(
        "sim", responses=responses, config={"reply": "slow " * 40, "tokens_per_second": 10}
    )
    pid = sim.runtime_handle["replicas"][0]["pid"]
    body = {"model": "sim", "input": "x", "stream": True}
    headers = {"authorization": f"Bearer {api_key()}"}
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", gateway_url + "/v1/responses", json=body, headers=headers, timeout=30
    ) as answer:
        lines: list[str] = []
        for line in answer.iter_lines():
            lines.append(line)
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "response.output_text.delta" and pid:
                    os.kill(pid, signal.SIGKILL)  # the engine dies mid-answer
                    pid = 0
    assert [line for line in lines if line][-1] == "data: [DONE]"  # the spec's terminal event
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["error", "response.failed"]
    assert events[-1]["response"]["status"] == "failed"
    for event in events[:-2] + events[-1:]:
        check_event(event)  # the failed response conforms too
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_it_turns_the_terminal_event_into_failed_when_the_response_cannot_be_stored(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:

    serving("sim", config={"reply": "slow " * 10, "tokens_per_second": 10})
    stream = client.responses.create(model="sim", input="x", stream=True)
    events = []
    try:
        for event in stream:
            events.append(event)
            if event.type == "response.output_text.delta" and len(events) < 6:
                with connection.schema_editor() as editor:  # the store goes away mid-answer
                    editor.delete_model(StoredResponse)
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(StoredResponse)
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None
    assert events[-1].response.error.code == "store_unavailable"
    assert "response.completed" not in [e.type for e in events]


def test_it_starts_an_on_demand_model_for_a_response_with_no_notice(
    client: openai.OpenAI, make_deployment: Any, site: Any
) -> None:

    site.MSHIP_ROUTE_REFRESH_S = 0.05
    lazy = make_deployment("lazy", mode="on_demand", idle_timeout_s=60, config={"reply": "up"})
    seen_by_gateway(lambda s: "lazy" in s.routes)
    with client.responses.stream(model="lazy", input="x") as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and final.output_text == "up"
    lazy.refresh_from_db()
    assert lazy.state == "ready"


@pytest.mark.postgres
def test_it_wakes_a_database_log_reader_on_append_instead_of_polling(
    transactional_db: None, settings: Any
) -> None:
    """A reader tailing a quiet run looks at the table every DB_POLL_S, not every 50 ms, and
    an append in its own process wakes it at once."""

    class Counting(replay.DatabaseLog):
        reads = 0

        async def read(self, response_id: str, after: int) -> list[Any]:
            Counting.reads += 1
            return await super().read(response_id, after)

    async def scenario() -> list[str]:
        log = Counting()
        await log.append("resp_q", [{"type": "response.created", "sequence_number": 0}])
        seen: list[str] = []

        async def reader() -> None:
            async for event in replay.tail(log, "resp_q", -1, lambda: asyncio.sleep(0, False)):
                seen.append(event["type"])

        task = asyncio.create_task(reader())
        await asyncio.sleep(1.2)  # a quiet run
        await log.append("resp_q", [{"type": "response.completed", "sequence_number": 1}])
        await asyncio.wait_for(task, 5)
        return seen

    assert asyncio.run(scenario()) == ["response.created", "response.completed"]
    assert Counting.reads <= 6  # 50 ms polling would have read about 25 times
