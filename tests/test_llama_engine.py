"""A real model on a real engine: the tiny GGUF the project makes, served by llama.cpp's own
server (the `xllamacpp` wheel's, behind the llama_server loader), called through /v1 with the
official openai SDK."""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.core.management import call_command
from django.db.models import Sum
from django.utils import timezone

from deployments import deployer, engine_secrets
from deployments.engine_metrics import engine_metrics_text, parse_gauges, read_load
from deployments.loaders import get_loader
from deployments.models import Deployment, State
from ondemand import baseline
from openai_api.usage.ledger import ledger
from openai_api.usage.models import UsageMinute
from tests.conftest import as_gateway, wait_until
from tests.docker_support import docker_block
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

# fixtures

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    call_command("make_tiny_model", str(folder / "tiny.gguf"))
    call_command("make_tiny_model", str(folder / "tiny-embed.gguf"), "--embedding")
    return {"chat": folder / "tiny.gguf", "embed": folder / "tiny-embed.gguf"}


def tiny(tiny_models: dict[str, Path], **config: Any) -> dict[str, Any]:
    return {
        "model": str(tiny_models["chat"]),
        "loader": "llama_server",
        "memory_gib": 0.5,
        "config": {"n_ctx": 2048, **config},
    }


def sdk(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)


HI: list[Any] = [{"role": "user", "content": "Say something about the weather."}]


def test_it_makes_a_tiny_model_that_llama_cpp_loads_and_whose_tokenizer_round_trips(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    tmp_path: Path,
) -> None:
    size = tiny_models["chat"].stat().st_size
    assert size < 10 * 2**20
    again = tmp_path / "again.gguf"
    call_command("make_tiny_model", str(again))
    assert again.read_bytes() == tiny_models["chat"].read_bytes()  # the same for a seed
    engine = serving("tiny", **tiny(tiny_models)).engine_url
    text = "the cat sat on the mat, then went out! 42"
    with httpx.Client(auth=as_gateway) as client:  # as the gateway: with the engine's secret
        tokens = client.post(engine + "/tokenize", json={"content": text}).json()["tokens"]
        assert 0 < len(tokens) < len(text.encode())  # the merges shortened it
        back = client.post(engine + "/detokenize", json={"tokens": tokens}).json()["content"]
    assert back == text


def test_it_answers_only_with_its_own_secret_which_the_gateway_sends(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    deployment = serving("tiny-guarded", **tiny(tiny_models))
    [handle] = deployment.runtime_handle["replicas"]
    engine, secret = deployment.engine_url, handle["secret"]
    key = api_key()
    body = {"model": "tiny-guarded", "messages": HI, "max_tokens": 2}
    # Straight at its port: nothing but its health without the engine's own secret, and a
    # gateway key is not it.
    for caller in ({}, {"authorization": f"Bearer {key}"}):
        with httpx.Client(headers=caller) as client:
            assert client.post(engine + "/v1/chat/completions", json=body).status_code == 401
            assert client.get(engine + "/slots").status_code == 401
            assert client.get(engine + "/metrics").status_code == 401
    assert httpx.get(engine + "/health").status_code == 200
    # Given in its environment, never on its command line (`ps` shows that to anyone).
    assert secret not in Path(f"/proc/{handle['pid']}/cmdline").read_text()
    assert f"LLAMA_API_KEY={secret}" in Path(f"/proc/{handle['pid']}/environ").read_text()
    # Through the gateway, it answers; the control plane reads its metrics.
    answer = sdk(gateway_url, key).chat.completions.create(
        model="tiny-guarded", messages=HI, max_tokens=2
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 2
    assert "llamacpp:" in engine_metrics_text(deployment, 0)
    with httpx.Client() as client:
        loader = get_loader("llama_server")
        assert read_load(client, engine, loader) is None  # without its secret: no gauges
        assert read_load(client, engine, loader, engine_secrets.auth(deployment)) is not None


def test_it_chats_with_the_real_engine_deterministically_and_to_max_tokens(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    serving("tiny", **tiny(tiny_models))
    client = sdk(gateway_url, api_key())
    first = client.chat.completions.create(model="tiny", messages=HI, max_tokens=12, temperature=0)
    again = client.chat.completions.create(model="tiny", messages=HI, max_tokens=12, temperature=0)
    text = first.choices[0].message.content or ""
    assert text and text == again.choices[0].message.content
    assert text.isprintable() and text.isascii()
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None and first.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model="tiny",
        messages=HI,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text
    assert usage is not None and usage.completion_tokens == len(pieces) == 12
    completion = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=7, temperature=0
    )
    assert completion.choices[0].text and completion.usage is not None
    assert completion.usage.completion_tokens == 7
    # Usage: the engine's own counts, a stream's asked of it though this client did not ask.
    unasked = list(
        client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=12, temperature=0, stream=True
        )
    )
    assert unasked and all(chunk.usage is None for chunk in unasked)

    def recorded() -> dict[str, Any]:
        ledger.flush()
        return UsageMinute.objects.filter(deployment="tiny").aggregate(
            requests=Sum("requests"),
            tokens_in=Sum("tokens_in"),
            tokens_out=Sum("tokens_out"),
            estimated=Sum("tokens_estimated"),
            cached=Sum("tokens_cached"),
        )

    # A stream's record closes just after its last chunk reaches the client.
    wait_until(lambda: recorded()["requests"] == 5, 10)
    used = recorded()
    chat_in = first.usage.prompt_tokens
    # The same prompt again: llama.cpp's prefix cache served it (its cached_tokens, cache_n).
    assert 0 < used.pop("cached") < 4 * chat_in
    assert used == {
        "requests": 5,
        "tokens_in": 4 * chat_in + completion.usage.prompt_tokens,
        "tokens_out": 4 * 12 + 7,
        "estimated": 0,
    }
    scraped = httpx.get(gateway_url + "/metrics").text
    cached = re.search(
        r'modelship_tokens_total\{direction="cached",key="",model="tiny"[^}]*\} (\S+)', scraped
    )
    assert cached is not None and float(cached.group(1)) > 0


def test_it_takes_a_default_answer_length_and_sampling_from_its_operator(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    """llama-server's -n is the length of an answer whose request names none (make run's
    chat: 1,024, so a small model rambling stops long before its context's end); a request's
    max_tokens still goes past it. The sampling flags are the defaults a request overrides."""
    flags = ["--n-predict", "9", "--temp", "0.2", "--top-p", "0.9", "--repeat-penalty", "1.1"]
    serving("capped", **tiny(tiny_models, extra_args=flags))
    client = sdk(gateway_url, api_key())
    unnamed = client.chat.completions.create(model="capped", messages=HI)
    named = client.chat.completions.create(model="capped", messages=HI, max_tokens=20)
    assert unnamed.usage is not None and unnamed.usage.completion_tokens == 9
    assert unnamed.choices[0].finish_reason == "length"
    assert named.usage is not None and named.usage.completion_tokens == 20


def test_it_reports_the_sampling_and_length_a_response_was_made_with(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    """`make run`'s chat (issue 58): a Responses object that set nothing says the operator's
    flags the engine ran it with, and is cut at the length it says; one that set its own
    says its own."""
    flags = ["--n-predict", "9", "--temp", "0.2", "--top-p", "0.9"]
    serving("capped", **tiny(tiny_models, extra_args=flags))
    client = sdk(gateway_url, api_key())
    unnamed = client.responses.create(model="capped", input="Say something.")
    assert (unnamed.temperature, unnamed.top_p, unnamed.max_output_tokens) == (0.2, 0.9, 9)
    assert unnamed.usage is not None and unnamed.usage.output_tokens == 9
    assert unnamed.status == "incomplete"
    own = client.responses.create(
        model="capped", input="Say something.", temperature=0, top_p=0.5, max_output_tokens=4
    )
    assert (own.temperature, own.top_p, own.max_output_tokens) == (0, 0.5, 4)


def test_it_embeds_one_vector_per_input(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    serving(
        "tiny-embed",
        **{**tiny(tiny_models), "model": str(tiny_models["embed"]), "usecase": "embed"},
    )
    vectors = (
        sdk(gateway_url, api_key())
        .embeddings.create(model="tiny-embed", input=["a red fox", "the sea", "a red fox"])
        .data
    )
    assert [v.index for v in vectors] == [0, 1, 2]
    assert {len(v.embedding) for v in vectors} == {64}  # the tiny model's width
    assert vectors[0].embedding == vectors[2].embedding
    assert vectors[0].embedding != vectors[1].embedding


def test_it_starts_the_real_engine_on_demand_on_the_first_request(
    tiny_models: dict[str, Path],
    make_deployment: Any,
    gateway_url: str,
    api_key: Callable[..., str],
    site: Any,
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    lazy = make_deployment("tiny-lazy", mode="on_demand", idle_timeout_s=60, **tiny(tiny_models))
    seen_by_gateway(lambda s: "tiny-lazy" in s.routes)
    answer = sdk(gateway_url, api_key()).chat.completions.create(
        model="tiny-lazy", messages=HI, max_tokens=5
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 5
    lazy.refresh_from_db()
    assert lazy.state == State.READY


def test_it_frees_the_engines_slot_when_the_client_hangs_up_mid_stream(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    # A long generation (seconds, at this model's speed), so it surely runs while we look.
    config = tiny(tiny_models, parallel=1)
    config["config"]["n_ctx"] = 16384
    engine = serving("tiny-one", **config).engine_url
    key = api_key()
    body = {"model": "tiny-one", "messages": HI, "max_tokens": 16000, "stream": True}
    started = threading.Event()
    with httpx.stream(
        "POST",
        gateway_url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    ) as answer:
        for _ in answer.iter_lines():
            started.set()
            # Its load gauges show it busy, so make-room and the reaper leave it alone (awaited
            # briefly: the gauge is the engine's own sample, not tied to the line we just read).
            with httpx.Client(auth=as_gateway) as client:

                def busy() -> bool:
                    load = read_load(client, engine, get_loader("llama_server"))
                    return load is not None and load.running == 1 and not load.idle

                wait_until(busy, 5)
            break  # and hang up
    assert started.is_set()
    # The one slot is free again: the next request is served, and the hung-up generation
    # stopped far short of its 16,000 tokens.
    after = sdk(gateway_url, key).chat.completions.create(
        model="tiny-one", messages=HI, max_tokens=3
    )
    assert after.usage is not None and after.usage.completion_tokens == 3

    def predicted() -> float:
        name = "llamacpp:tokens_predicted_total"
        text = httpx.get(engine + "/metrics", auth=as_gateway).text
        return parse_gauges(text, {name}).get(name, 0.0)

    wait_until(lambda: predicted() >= 3, 5)
    assert predicted() < 16000


def test_it_runs_the_same_launcher_in_a_container(
    tiny_models: dict[str, Path],
    docker_site: Any,
    make_deployment: Any,
) -> None:
    """The docker runtime with the tests' image: llama.cpp's server from the same wheel,
    the model's folder bind-mounted by the runtime, called on its published port."""
    boxed = make_deployment(
        "tiny-boxed",
        runtime="docker",
        docker_options=docker_block(),
        **tiny(tiny_models, binary="xllamacpp"),
    )
    deployer.restart(boxed.pk)
    boxed.refresh_from_db()
    assert boxed.state == State.READY, boxed.state_reason
    assert boxed.runtime_handle["replicas"][0]["container_id"]
    answer = httpx.post(
        boxed.engine_url + "/v1/chat/completions",
        json={"messages": HI, "max_tokens": 4, "temperature": 0},
        timeout=30,
        auth=as_gateway,
    ).json()
    assert answer["usage"]["completion_tokens"] == 4


def test_it_fails_a_start_on_a_file_that_is_no_model_with_llama_cpps_words(
    make_deployment: Any, tmp_path: Path
) -> None:

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf at all")
    deployment = make_deployment(
        "tiny-broken", loader="llama_server", model=str(broken), memory_gib=0.5
    )
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "llama_launcher: could not start" in deployment.state_reason


def test_it_serves_the_responses_api_from_the_real_engine(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    serving("tiny", **tiny(tiny_models))
    client = sdk(gateway_url, api_key())
    first = client.responses.create(
        model="tiny", input="Hello there", max_output_tokens=6, temperature=0
    )
    assert first.status == "incomplete" and first.output_text  # it runs to the limit
    assert first.usage is not None and first.usage.output_tokens == 6
    with client.responses.stream(
        model="tiny", input="And now?", previous_response_id=first.id, max_output_tokens=5
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    second = events[-1].response  # type: ignore[union-attr]
    assert second.previous_response_id == first.id and second.output_text
    items = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items] == ["message", "message", "message"]
    queued = client.responses.create(
        model="tiny", input="In the background", background=True, max_output_tokens=4
    )

    def done() -> bool:
        return client.responses.retrieve(queued.id).status == "incomplete"

    wait_until(done, 30)


def test_it_counts_input_tokens_with_llama_cpps_own_tokenizer(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    deployment = serving("tiny", **tiny(tiny_models))
    counted = sdk(gateway_url, api_key()).responses.input_tokens.count(
        model="tiny", input="Hello there", instructions="Be brief."
    )
    # What llama.cpp itself makes of that chat: its template applied, then tokenized.
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
    ]
    url = deployment.engine_url
    with httpx.Client(auth=as_gateway) as client:
        prompt = client.post(url + "/apply-template", json={"messages": chat}).json()["prompt"]
        tokens = client.post(url + "/tokenize", json={"content": prompt}).json()["tokens"]
    assert counted.input_tokens == len(tokens) > 0


ROLL: Any = {"type": "function", "function": {"name": "roll", "parameters": {"type": "object"}}}
FLIP: Any = {"type": "function", "function": {"name": "flip", "parameters": {"type": "object"}}}


def test_it_says_llama_cpps_errors_and_forced_tools_in_openais_words(
    tiny_models: dict[str, Path],
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    serving("tiny", **tiny(tiny_models, n_ctx=256))
    client = sdk(gateway_url, api_key())
    too_long: list[Any] = [{"role": "user", "content": "the cat sat " * 400}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=too_long, max_tokens=4)
    # llama.cpp says "code": 400 and its own type; a client reads OpenAI's word.
    assert refused.value.code == "context_length_exceeded", refused.value.body
    with pytest.raises(openai.BadRequestError) as streamed:
        client.responses.create(model="tiny", input="the cat sat " * 400, max_output_tokens=4)
    assert streamed.value.code == "context_length_exceeded", streamed.value.body
    # A forced function reaches llama.cpp as the word it reads; one not offered is a 400.
    forced = client.chat.completions.create(
        model="tiny",
        messages=HI,
        max_tokens=4,
        tools=[ROLL, FLIP],
        tool_choice={"type": "function", "function": {"name": "flip"}},
    )
    assert forced.choices[0].finish_reason in ("length", "stop", "tool_calls")
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model="tiny",
            messages=HI,
            max_tokens=4,
            tools=[ROLL],
            tool_choice={"type": "function", "function": {"name": "fly"}},
        )
    assert unknown.value.body["param"] == "tool_choice"  # type: ignore[index]


def test_it_keeps_to_the_loaded_model_cap_and_restores_the_baseline_with_the_real_engine(
    tiny_models: dict[str, Path],
    make_deployment: Any,
    gateway_url: str,
    api_key: Callable[..., str],
    site: Any,
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    site.MSHIP_MAX_LOADED_MODELS = 1
    site.MSHIP_BASELINE_AFTER_S = 600
    made = {
        name: make_deployment(name, mode="on_demand", idle_timeout_s=60, **tiny(tiny_models))
        for name in ("tiny-first", "tiny-second")
    }
    Deployment.objects.filter(name="tiny-first").update(preload=True)  # the baseline
    seen_by_gateway(lambda s: {"tiny-first", "tiny-second"} <= set(s.routes))
    client = sdk(gateway_url, api_key())
    for name in ("tiny-first", "tiny-second"):
        answer = client.chat.completions.create(model=name, messages=HI, max_tokens=3)
        assert answer.usage is not None and answer.usage.completion_tokens == 3
    first, second = (Deployment.objects.get(pk=made[n].pk) for n in ("tiny-first", "tiny-second"))
    # Memory had room for both; the cap of one loaded model did not.
    assert (first.state, first.state_reason) == (
        State.STOPPED,
        "Put to sleep to make room for tiny-second",
    )
    assert second.state == State.READY and second.start_s is not None
    # A quiet hour later the second is put away by its idle timeout, and the baseline is back.
    deployer.stop(second.pk, reason="idle")
    then = timezone.now() - timedelta(seconds=601)
    Deployment.objects.update(state_changed_at=then, lease_until=then)
    assert baseline.restore() == ["tiny-first"]
    assert Deployment.objects.get(pk=first.pk).state == State.READY
