"""The simulated engine behaves like vLLM on the wire and records hang-ups."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from deployments import deployer
from deployments.models import Deployment, State
from tests.conftest import as_gateway, chat, pid_alive, wait_until

pytestmark = pytest.mark.usefixtures("engines")


def running(make_deployment: Any, **config: Any) -> Deployment:
    deployment: Deployment = make_deployment(config=config)
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    return deployment


def test_it_streams_tokens_at_its_rate_with_usage(make_deployment: Any) -> None:
    url = running(make_deployment, reply="one two three", tokens_per_second=100).engine_url
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 5,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, auth=as_gateway) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three one two"
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_it_echoes_reasons_and_calls_tools_on_request(make_deployment: Any) -> None:
    url = running(make_deployment, echo=True, reasoning="Let me think", tool_call=True).engine_url
    plain = chat(url, "say this back")["choices"][0]["message"]
    assert plain["content"] == "say this back"
    assert plain["reasoning_content"] == "Let me think"
    tools = [{"type": "function", "function": {"name": "roll", "parameters": {}}}]
    called = chat(url, "roll", tools=tools)["choices"][0]
    assert called["finish_reason"] == "tool_calls"
    assert called["message"]["tool_calls"][0]["function"]["name"] == "roll"


def test_it_embeds_deterministically(make_deployment: Any) -> None:
    url = running(make_deployment, embedding_dim=8).engine_url
    said = {"model": "sim", "input": ["a", "b", "a"]}
    answer = httpx.post(url + "/v1/embeddings", json=said, auth=as_gateway)
    vectors = [d["embedding"] for d in answer.json()["data"]]
    assert len(vectors) == 3 and len(vectors[0]) == 8
    assert vectors[0] == vectors[2] != vectors[1]


def test_it_receives_a_multipart_upload_intact(make_deployment: Any) -> None:
    url = running(make_deployment).engine_url
    audio = bytes(range(256)) * 100
    answer = httpx.post(
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", audio, "audio/wav")},
        data={"model": "sim"},
        auth=as_gateway,
    )
    assert answer.json()["text"] == f"{len(audio)} bytes sha256={hashlib.sha256(audio).hexdigest()}"


def test_it_records_a_client_that_hangs_up_mid_stream(make_deployment: Any) -> None:
    url = running(make_deployment, tokens_per_second=5, max_tokens=100).engine_url
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json=body,
        headers={"X-Request-Id": "gone-1"},
        auth=as_gateway,
    ) as answer:
        for line in answer.iter_lines():
            if '"content": "This"' in line:
                break  # hang up after the first token
    wait_until(lambda: httpx.get(url + "/sim/cancellations").json()["count"] == 1, 10)
    record = httpx.get(url + "/sim/cancellations").json()["cancelled"][0]
    assert record["path"] == "/v1/chat/completions"
    assert record["request_id"] == "gone-1"
    metrics = httpx.get(url + "/metrics").text
    assert 'vllm:num_requests_running{model_name="sim"} 0' in metrics


def test_it_reports_requests_running_in_its_metrics(make_deployment: Any) -> None:
    url = running(make_deployment, tokens_per_second=20, memory_claim_gib=1).engine_url
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 40,
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, auth=as_gateway) as answer:
        lines = answer.iter_lines()  # held: dropping it would close the stream
        next(lines)
        metrics = httpx.get(url + "/metrics").text
    assert 'vllm:num_requests_running{model_name="sim"} 1' in metrics
    assert "modelship_sim_memory_bytes 1073741824" in metrics


def test_it_crashes_after_n_requests_when_told_to(make_deployment: Any) -> None:
    deployment = running(make_deployment, crash_after_requests=2)
    pid = deployment.runtime_handle["replicas"][0]["pid"]
    chat(deployment.engine_url)
    chat(deployment.engine_url)
    wait_until(lambda: not pid_alive(pid), 10)


def test_it_serves_responses_itself_as_the_sdk_reads_them(make_deployment: Any) -> None:
    deployment = running(make_deployment, reply="one two three", reasoning="Hmm")
    url, secret = deployment.engine_url, deployment.runtime_handle["replicas"][0]["secret"]
    client = openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0)
    answer = client.responses.create(model="sim", input="hi")
    assert (answer.status, answer.output_text) == ("completed", "one two three")
    assert [item.type for item in answer.output] == ["reasoning", "message"]

    events = list(
        client.responses.create(model="sim", input="hi", max_output_tokens=2, stream=True)
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == "one two"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"

    refused = httpx.post(url + "/v1/responses", json={"model": "sim", "input": 3}, auth=as_gateway)
    assert refused.status_code == 400


def test_it_asks_for_its_own_secret_under_v1_which_the_gateway_sends_for_the_caller(
    serving: Any, gateway_url: str, api_key: Any
) -> None:
    deployment = serving("guarded")
    [handle] = deployment.runtime_handle["replicas"]
    engine, secret = deployment.engine_url, handle["secret"]
    key = api_key()
    body = {"model": "guarded", "messages": [{"role": "user", "content": "hi"}]}
    # Straight at its port: 401 without its secret, and a gateway key is not it.
    for caller in ({}, {"authorization": f"Bearer {key}"}, {"authorization": "Bearer x"}):
        refused = httpx.post(engine + "/v1/chat/completions", json=body, headers=caller)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(engine + "/v1/models", headers=caller).status_code == 401
    assert httpx.get(engine + "/health").status_code == 200  # as vLLM: /v1 only
    assert secret not in Path(f"/proc/{handle['pid']}/cmdline").read_text()
    # Through the gateway it answers, and what the engine saw as Authorization is its own
    # secret, never the caller's key.
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    seen = httpx.get(engine + "/sim/last_chat_headers").json()
    said = [value for name, value in seen.items() if name.lower() == "authorization"]
    assert said == [f"Bearer {secret}"]
    # Each start is a new secret.
    deployer.stop(deployment.pk)
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.runtime_handle["replicas"][0]["secret"] not in ("", secret)
