"""An on-demand model loaded on one host is served there through every gateway host of the
site: a second gateway host (`serve --gateway-only`, its own run folder as another machine
has) forwards to the loaded engine rather than start a second copy."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Any

import openai
import pytest

from deployments.models import Deployment, DeploymentEvent, State
from deployments.runtimes.process import free_port
from tests.conftest import REPO, answers, env_for_subprocess, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")
HI: list[Any] = [{"role": "user", "content": "hi"}]


def test_it_serves_a_model_loaded_on_one_host_through_another_without_a_second_start(
    gateway_url: str,
    tmp_path: Path,
    api_key: Callable[..., str],
    make_deployment: Callable[..., Deployment],
) -> None:
    lazy = make_deployment(
        "lazy", mode="on_demand", idle_timeout_s=600, config={"reply": "from the engine host"}
    )
    key = api_key()
    here = openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0)
    # The first request, on the engine host, starts the model there.
    answer = here.chat.completions.create(model="lazy", messages=HI)
    assert answer.choices[0].message.content == "from the engine host"
    lazy.refresh_from_db()
    assert lazy.state == State.READY
    loaded = list(lazy.engine_urls)
    port = free_port("127.0.0.1")
    other_host = subprocess.Popen(
        [*(sys.executable, "manage.py", "serve", "--port", str(port)), "--gateway-only"],
        cwd=REPO,
        env=env_for_subprocess(
            MSHIP_VAR_DIR=str(tmp_path / "var"),
            MSHIP_RUN_DIR=str(tmp_path / "other-host"),
            MSHIP_ROUTE_REFRESH_S="0.05",
        ),
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(url + "/health"), 60)
        there = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        for _ in range(3):
            answer = there.chat.completions.create(model="lazy", messages=HI)
            assert answer.choices[0].message.content == "from the engine host"
    finally:
        other_host.terminate()
        other_host.wait(60)
    lazy.refresh_from_db()
    assert (lazy.state, list(lazy.engine_urls)) == (State.READY, loaded)
    assert DeploymentEvent.objects.filter(deployment=lazy, kind=State.STARTING).count() == 1
