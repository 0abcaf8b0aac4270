"""A start that runs out of memory (deployments/out_of_memory.py): each engine's words are
read as such, the next start claims what the engine showed it needs, and an on-demand start
is tried once more with that claim, through /v1 with the simulated engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
from django.contrib import admin

from deployments import deployer, footprint, out_of_memory
from deployments.api.serializers import DeploymentSerializer
from deployments.engines.sim_sleep import OUT_OF_MEMORY
from deployments.memory import need_gib
from deployments.models import Deployment, DeploymentEvent, State
from modelship_cli.render import description
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
    # It needs (and, once started, holds) 0.15 GiB: the simulated engine's footprint.
    config = {"needs_gib": 0.15, "out_of_memory": "cuda", "reply": "loaded"}
    hungry = make_deployment("hungry", mode="on_demand", memory_gib=0.1, config=config)
    seen_by_gateway(lambda s: "hungry" in s.routes)
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    answer = sdk.chat.completions.create(
        model="hungry", messages=[{"role": "user", "content": "x"}]
    )
    assert answer.choices[0].message.content == "loaded"
    hungry.refresh_from_db()
    failed = DeploymentEvent.objects.filter(deployment=hungry, kind="failed").get()
    assert failed.text.startswith(
        "Out of memory: the GPU ran out of memory while the engine loaded (CUDA out of memory);"
        " the next start claims 0.6 GiB per replica instead of 0.1."  # at least 0.5 more
    )
    # Started with 0.6, it was measured holding what it needs: the claim goes halfway there.
    assert hungry.state == State.READY and hungry.learned_on == ""  # no GPU model here
    assert hungry.measured_gib is not None and 0.15 <= hungry.measured_gib < 0.5
    target = max(0.1, hungry.measured_gib * footprint.MARGIN)
    assert hungry.learned_gib == pytest.approx(0.6 - (0.6 - target) / 2, abs=0.002)


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


def test_it_lets_a_learned_claim_go_halfway_to_the_measured_footprint() -> None:
    # Another process's memory made a start fail: the engine needs far less than learned.
    assert footprint.settled(2.0, 1.0, 0.2) == 1.5
    assert footprint.settled(1.04, 1.0, 0.2) is None  # within 0.05 GiB: forgotten
    # An engine that holds what it is given (vLLM) keeps its claim; so does one that needs it.
    assert footprint.settled(2.0, 1.0, 2.0) == 2.0
    assert footprint.settled(2.0, 1.0, 1.9) == 2.0
    assert footprint.settled(3.0, 1.0, 1.5) == pytest.approx(2.325)  # toward 1.5 x 1.1
    assert footprint.settled(2.0, 1.0, None) == 2.0  # not measured: nothing learned changes


@pytest.mark.usefixtures("engines")
def test_it_forgets_a_claim_the_engine_never_needed_and_keeps_another_gpus_apart(
    make_deployment: Any,
) -> None:
    lean = make_deployment("lean", memory_gib=0.1)
    Deployment.objects.filter(pk=lean.pk).update(learned_gib=0.5)
    claims = []
    for _ in range(5):
        deployer.stop(lean.pk)
        deployer.restart(lean.pk)
        lean.refresh_from_db()
        assert lean.state == State.READY and lean.measured_gib is not None
        claims.append(lean.learned_gib)
        if lean.learned_gib is None:
            break
    assert claims == [0.3, 0.2, None]  # 0.15 is within 0.05 GiB of 0.1: forgotten
    assert need_gib(lean) == pytest.approx(0.1)
    # A claim learned on another GPU model is not this host's: not claimed, not decayed.
    Deployment.objects.filter(pk=lean.pk).update(learned_gib=2.0, learned_on="NVIDIA H100 PCIe")
    lean.refresh_from_db()
    assert need_gib(lean) == pytest.approx(0.1)
    deployer.stop(lean.pk)
    deployer.restart(lean.pk)
    lean.refresh_from_db()
    assert (lean.learned_gib, lean.learned_on) == (2.0, "NVIDIA H100 PCIe")
    # Declared, learned and measured, side by side: the API, `modelship describe`, the admin.
    shown = DeploymentSerializer(lean).data
    assert (shown["memory_gib"], shown["learned_gib"]) == (0.1, 2.0)
    assert (shown["learned_on"], shown["measured_gib"]) == ("NVIDIA H100 PCIe", lean.measured_gib)
    lines = description(dict(shown), [])
    assert "Learned on:" in "".join(lines) and f"{lean.measured_gib}" in "".join(lines)
    page = admin.site._registry[Deployment].memory_seen(lean)  # type: ignore[attr-defined]
    assert page.startswith("declared 0.1 GiB; learned 2 GiB on NVIDIA H100 PCIe")
