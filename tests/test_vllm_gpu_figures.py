"""vLLM's figures on a GPU host (scripts/gpu_check.py's `vllm-figures` step), said in a
warning as a table: start to ready and first token; sleep at level 1 and at level 2 and
each wake; the KV cache vLLM allocated (its `vllm:cache_config_info` blocks) against the
full-length sequences Modelship's estimate says fit in the memory it gave; an out-of-memory
start (a claim too small for the model's cache) learned and recovered on the retry. Skipped
where NVML sees no GPU: vLLM's CPU build neither sleeps nor runs out of GPU memory."""

from __future__ import annotations

import re
import time
import warnings
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from deployments import deployer, nvml
from deployments.memory import estimate_report
from deployments.models import Deployment, State
from tests.gateway_support import seen_by_gateway
from tests.tiny_models import made

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

ON_GPU = bool(nvml.readings())
pytestmark = [
    pytest.mark.usefixtures("engines"),
    pytest.mark.heavy,
    pytest.mark.skipif(not ON_GPU, reason="vLLM's figures on CUDA only (scripts/gpu_check.py)"),
]
CONFIG = {"max_model_len": 2048, "enforce_eager": True, "enable_sleep_mode": True}
BLOCKS = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)


@pytest.fixture(scope="module")
def tiny_llama(django_db_blocker: Any) -> Path:
    with django_db_blocker.unblock():
        return made("hf-llama", seed=1, name="tiny-hf-llama")


def kv_tokens(url: str) -> int | None:
    """The tokens of KV cache vLLM allocated: its blocks times their size."""
    found = BLOCKS.search(httpx.get(url + "/metrics", timeout=10).text)
    if found is None:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
    blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
    if not (blocks and size and blocks.isdigit() and size.isdigit()):
        return None
    return int(blocks) * int(size)


def test_it_measures_vllms_start_sleeps_wakes_cache_and_an_out_of_memory_start(
    make_deployment: Any,
    gateway_url: str,
    api_key: Callable[..., str],
    tiny_llama: Path,
    site: Any,
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    rows: list[tuple[str, str]] = []
    fig = make_deployment(
        "fig-vllm", loader="vllm", model=str(tiny_llama), memory_gib=3, config=CONFIG
    )
    began = time.monotonic()
    deployer.restart(fig.pk)
    fig.refresh_from_db()
    assert fig.state == State.READY, fig.state_reason
    rows.append(("start to ready (s)", f"{time.monotonic() - began:.1f}"))
    seen_by_gateway(lambda s: "fig-vllm" in s.routes and s.routes["fig-vllm"].state == "ready")
    sdk = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    began = time.monotonic()
    first = sdk.chat.completions.create(
        model="fig-vllm", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert first.choices
    rows.append(("first token after ready (s)", f"{time.monotonic() - began:.2f}"))

    allocated = kv_tokens(fig.engine_url)
    report = estimate_report(fig) or {}
    rows.append(("KV cache vLLM allocated (tokens)", str(allocated)))
    rows.append(
        (
            "full-length sequences: vLLM's / Modelship's count",
            f"{allocated // CONFIG['max_model_len'] if allocated else '?'}"
            f" / {report.get('sequences_fit')}",
        )
    )
    rows.append(("measured footprint (GiB, NVML)", str(fig.measured_gib)))

    for level, host_gib in ((1, 1000.0), (2, 0.0)):
        site.MSHIP_SLEEP_HOST_GIB = host_gib  # room for its weights in host memory, or none
        began = time.monotonic()
        assert deployer.sleep(fig.pk, reason="gpu check")
        slept = time.monotonic() - began
        fig.refresh_from_db()
        assert (fig.state, fig.sleep_level) == (State.ASLEEP, level)
        began = time.monotonic()
        deployer.wake(fig.pk)
        woke = time.monotonic() - began
        fig.refresh_from_db()
        assert fig.state == State.READY, fig.state_reason
        rows.append((f"sleep level {level} / its wake (s)", f"{slept:.2f} / {woke:.2f}"))
        answer = sdk.chat.completions.create(
            model="fig-vllm", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        assert answer.choices  # it answers after the wake
    deployer.stop(fig.pk)

    # A claim too small for even one sequence of cache: out of memory, learned, retried.
    starved = make_deployment(
        "fig-starved",
        loader="vllm",
        model=str(tiny_llama),
        mode="on_demand",
        idle_timeout_s=60,
        memory_gib=0.05,
        config=CONFIG,
    )
    seen_by_gateway(lambda s: "fig-starved" in s.routes)
    try:
        answer = sdk.chat.completions.create(
            model="fig-starved", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        outcome = "recovered on the retry" if answer.choices else "no answer"
    except openai.APIStatusError as exc:
        outcome = f"not recovered: {exc.status_code}"
    starved = Deployment.objects.get(pk=starved.pk)
    rows.append(("out-of-memory start", f"{outcome}; learned {starved.learned_gib} GiB"))
    warnings.warn(
        "vLLM on this GPU:\n| figure | value |\n| --- | --- |\n"
        + "\n".join(f"| {name} | {value} |" for name, value in rows),
        stacklevel=1,
    )
    assert starved.learned_gib is not None and outcome == "recovered on the retry"
