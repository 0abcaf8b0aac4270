"""A start that runs out of memory (deployments/out_of_memory.py): each engine's words are
read as such, the next start claims what the engine showed it needs, and an on-demand start
is tried once more with that claim, through /v1 with the simulated engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from deployments import out_of_memory
from deployments.engines.sim_sleep import OUT_OF_MEMORY
from deployments.models import Deployment, DeploymentEvent, State
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable


@pytest.mark.parametrize("engine", ["cuda", "vllm", "llama"])
def test_it_reads_each_engines_words_for_running_out_of_memory(engine: str) -> None:
    said = OUT_OF_MEMORY[engine](0.5)
    assert out_of_memory.cause(f"the engine exited with code 1\n{said}")
    assert out_of_memory.cause("ImportError: no module named vllm") is None


def test_it_claims_what_the_engine_tried_to_allocate_or_a_quarter_more() -> None:
    assert out_of_memory.learned_need(OUT_OF_MEMORY["cuda"](2.0), 8.0) == 10.0
    assert out_of_memory.learned_need(OUT_OF_MEMORY["vllm"](2.0), 8.0) == 10.0  # +25%
    assert out_of_memory.learned_need(OUT_OF_MEMORY["vllm"](2.0), 2.0) == 3.0  # at least 1
    assert out_of_memory.learned_need(OUT_OF_MEMORY["llama"](0.25), 2.0) == 2.5  # 256 MiB: 0.5
    assert out_of_memory.learned_need("allocating . MiB on device 0", 2.0) == 3.0  # no figure
    assert out_of_memory.learned_need("allocating . MiB on device 0", 2.0) == 3.0  # no figure


@pytest.mark.usefixtures("engines")
def test_it_tries_an_out_of_memory_start_once_more_claiming_what_it_needs(
    make_deployment: Any, api_key: Callable[..., str], gateway_url: str, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    config = {"needs_gib": 1.5, "out_of_memory": "cuda", "reply": "loaded"}
    hungry = make_deployment("hungry", mode="on_demand", memory_gib=1, config=config)
    seen_by_gateway(lambda s: "hungry" in s.routes)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    answer = sdk.chat.completions.create(
        model="hungry", messages=[{"role": "user", "content": "x"}]
    )
    assert answer.choices[0].message.content == "loaded"
    hungry.refresh_from_db()
    assert (hungry.state, hungry.learned_gib) == (State.READY, 1.5)
    failed = DeploymentEvent.objects.filter(deployment=hungry, kind="failed").get()
    assert failed.text.startswith(
        "Out of memory: the GPU ran out of memory while the engine loaded (CUDA out of memory);"
        " the next start claims 1.5 GiB per replica instead of 1."
    )


@pytest.mark.usefixtures("engines")
def test_it_fails_a_start_out_of_memory_twice_with_the_cause_in_words(
    make_deployment: Any, api_key: Callable[..., str], gateway_url: str, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    config = {"needs_gib": 4, "out_of_memory": "vllm"}
    make_deployment("greedy", mode="on_demand", memory_gib=1, config=config)
    seen_by_gateway(lambda s: "greedy" in s.routes)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    with pytest.raises(openai.InternalServerError) as failed:
        sdk.chat.completions.create(model="greedy", messages=[{"role": "user", "content": "x"}])
    assert failed.value.status_code == 503 and "ran out of memory as it started" in str(
        failed.value
    )
    greedy = Deployment.objects.get(name="greedy")
    assert greedy.state == State.FAILED and greedy.learned_gib == 3.0  # 1, 2 (at least 1 more), 3
    assert "the model's weights left no GPU memory for vLLM's KV cache blocks" in (
        greedy.state_reason
    )
