"""The request path through a real LiteLLM proxy (`litellm[proxy]` from PyPI), started from
the static model_list that `manage.py litellm_config` renders: always-on names go straight
to their engine, on-demand names through Modelship's on-demand gateway, which wakes them."""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import yaml
from django.core.management import call_command

from deployments import deployer
from deployments.models import Deployment, DeploymentEvent, State
from deployments.runtimes.process import free_port
from tests.conftest import answers, wait_until
from tests.gateway_support import reread_guard, seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")
MASTER = "sk-master-" + secrets.token_hex(4)


NOT_FOR_LITELLM = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")


def start_proxy(tmp_path: Path, capsys: Any) -> tuple[subprocess.Popen[bytes], str]:
    call_command("litellm_config")
    config = yaml.safe_load(capsys.readouterr().out)
    config["general_settings"] = {"master_key": MASTER}
    (tmp_path / "litellm.yaml").write_text(yaml.safe_dump(config))
    port = free_port("127.0.0.1")
    litellm = Path(sys.executable).parent / "litellm"
    proxy = subprocess.Popen(
        [str(litellm), "--config", str(tmp_path / "litellm.yaml"), "--port", str(port)],
        # Modelship's own DATABASE_URL and REDIS_URL would send LiteLLM to its database layer
        # (whose engines it downloads at start) and its Redis cache: it runs on its config.
        # And LiteLLM empties PROMETHEUS_MULTIPROC_DIR at start: this process's metrics.
        env={
            **{k: v for k, v in os.environ.items() if k not in NOT_FOR_LITELLM},
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
        stdout=(tmp_path / "litellm.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(url + "/health/liveliness"), 90)
    return proxy, url


def test_it_serves_modelship_deployments_through_a_real_litellm_proxy(
    gateway_url: str,
    api_key: Callable[..., str],
    make_deployment: Any,
    site: Any,
    tmp_path: Path,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    monkeypatch.setenv("MSHIP_IN_CONTAINER", "0")
    (tmp_path / "ondemand_key").write_text("odk-" + secrets.token_hex(8))
    site.MSHIP_ONDEMAND_KEY_FILE = tmp_path / "ondemand_key"
    site.MSHIP_ONDEMAND_ALLOWED_CIDRS = "127.0.0.1/32"  # where LiteLLM connects from
    site.MSHIP_INTERNAL_URL = gateway_url
    reread_guard()
    steady = make_deployment("steady", config={"reply": "from the engine"})
    deployer.restart(steady.pk)
    lazy = make_deployment(
        "lazy", mode="on_demand", idle_timeout_s=60, config={"reply": "woke", "startup_delay_s": 2}
    )
    flaky = make_deployment("flaky", mode="on_demand", config={"fail_at_start": True})
    seen_by_gateway(lambda s: {"steady", "lazy", "flaky"} <= set(s.routes))
    proxy, url = start_proxy(tmp_path, capsys)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=MASTER, max_retries=0, timeout=120)
        hello: list[Any] = [{"role": "user", "content": "hi"}]
        answer = client.chat.completions.create(model="steady", messages=hello)
        assert answer.choices[0].message.content == "from the engine"
        # LiteLLM's health probe of the on-demand model is answered without waking it.
        health = httpx.get(
            url + "/health", params={"model": "lazy"}, headers={"authorization": f"Bearer {MASTER}"}
        )
        assert health.status_code == 200 and health.json()["healthy_count"] == 1
        lazy.refresh_from_db()
        assert lazy.state == State.PLANNED
        # The first request wakes it through the on-demand gateway and waits out the start.
        woke = client.chat.completions.create(model="lazy", messages=hello)
        assert woke.choices[0].message.content == "woke"
        lazy.refresh_from_db()
        assert lazy.state == State.READY
        stream = client.chat.completions.create(model="lazy", messages=hello, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "woke"
        # A Responses request passes through to the engine, which serves /v1/responses.
        response = client.responses.create(model="steady", input="hi")
        assert response.output_text == "from the engine"
        assert client.responses.create(model="lazy", input="hi").output_text == "woke"
        # An Anthropic-format request passes through too.
        messages = httpx.post(
            url + "/v1/messages",
            json={"model": "lazy", "max_tokens": 16, "messages": hello},
            headers={"authorization": f"Bearer {MASTER}"},
            timeout=60,
        )
        assert messages.status_code == 200 and "woke" in messages.text
        # A failing start is not retried by LiteLLM: one start, one error.
        with pytest.raises(openai.APIStatusError):
            client.chat.completions.create(model="flaky", messages=hello)
        assert DeploymentEvent.objects.filter(deployment=flaky, kind="starting").count() == 1
        # What LiteLLM adds to an always-on request, against Modelship's own /v1.
        direct = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
        timings = {"litellm": [], "modelship": []}  # type: dict[str, list[float]]
        for _ in range(15):
            for name, sdk in (("litellm", client), ("modelship", direct)):
                began = time.perf_counter()
                sdk.chat.completions.create(model="steady", messages=hello)
                timings[name].append(time.perf_counter() - began)
        medians = {k: round(statistics.median(v) * 1000, 1) for k, v in timings.items()}
        print("always-on request, median ms:", medians)
    finally:
        proxy.terminate()
        proxy.wait(30)
    steady.refresh_from_db()
    assert Deployment.objects.get(pk=steady.pk).state == State.READY
