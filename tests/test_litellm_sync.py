"""Registration with a site's LiteLLM proxy, against a stand-in for LiteLLM's model
management endpoints that validates every body with LiteLLM's own pydantic types (from the
installed `litellm` package) and keeps its model list in memory. The real proxy cannot take
registrations here (its database layer downloads engines at start-up); the request path
through a real proxy is in test_litellm_proxy.py."""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from typing import TYPE_CHECKING, Any

import pytest
import uvicorn
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command
from litellm.proxy._types import ModelInfoDelete
from litellm.types.router import Deployment as LiteLLMDeployment
from rest_framework.test import APIClient

from deployments import deployer
from deployments.models import Deployment, State
from deployments.operations import set_mode
from deployments.runtimes.process import free_port
from ondemand import litellm
from ondemand.litellm import deployment_status, status_now, sync
from tests.conftest import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import

pytestmark = pytest.mark.usefixtures("engines")
MASTER = "sk-master-" + secrets.token_hex(4)


class StandIn:
    """LiteLLM's /model/new, /model/delete and /model/info, in memory."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.fail_after: int | None = None  # writes allowed before it answers 500
        self.timeline: list[set[str]] = []  # served names listed after each write

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        status, answer = 200, dict[str, Any]()
        if headers.get(b"authorization") != f"Bearer {MASTER}".encode():
            status, answer = 401, {"error": "bad master key"}
        elif scope["path"] == "/model/info":
            answer = {"data": [self.public(m) for m in self.models.values()]}
        elif self.fail_after is not None and self.writes >= self.fail_after:
            status, answer = 500, {"error": "stand-in stopped"}
        elif scope["path"] == "/model/new":
            entry = LiteLLMDeployment.model_validate(json.loads(body))  # as LiteLLM parses it
            assert entry.model_info.id
            self.models[entry.model_info.id] = json.loads(body)
            self.wrote()
        elif scope["path"] == "/model/delete":
            target = ModelInfoDelete.model_validate(json.loads(body))
            if target.id not in self.models:
                status, answer = 400, {"error": "no such model"}
            else:
                del self.models[target.id]
                self.wrote()
        else:
            status = 404
        raw = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": raw})

    def wrote(self) -> None:
        self.writes += 1
        self.timeline.append({m["model_name"] for m in self.models.values()})

    @staticmethod
    def public(entry: dict[str, Any]) -> dict[str, Any]:
        """As /model/info shows it: without the key."""
        params = {k: v for k, v in entry["litellm_params"].items() if k != "api_key"}
        return {**entry, "litellm_params": params}

    def entries(self, name: str) -> list[dict[str, Any]]:
        return [m for m in self.models.values() if m["model_name"] == name]


@pytest.fixture
def stand_in(site: Any, tmp_path: Path) -> Iterator[StandIn]:
    app = StandIn()
    port = free_port("127.0.0.1")
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20)
    (tmp_path / "master").write_text(MASTER)
    (tmp_path / "ondemand_key").write_text("odk-first")
    site.MSHIP_LITELLM_URL = f"http://127.0.0.1:{port}"
    site.MSHIP_LITELLM_MASTER_KEY_FILE = tmp_path / "master"
    site.MSHIP_ONDEMAND_KEY_FILE = tmp_path / "ondemand_key"
    site.MSHIP_INTERNAL_URL = "http://modelship.internal:8000"
    yield app
    server.should_exit = True
    thread.join(10)


def ready(make_deployment: Callable[..., Deployment], name: str, **fields: Any) -> Deployment:
    deployment = make_deployment(name, **fields)
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY
    return deployment


def test_it_registers_always_on_and_on_demand_deployments(
    stand_in: StandIn, make_deployment: Callable[..., Deployment]
) -> None:
    steady = ready(make_deployment, "steady", aliases=["st"])
    lazy = make_deployment("lazy", mode="on_demand", idle_timeout_s=120)
    make_deployment("broken", mode="on_demand", state="failed")
    outcome = sync()
    assert outcome is not None and not outcome.error and len(outcome.added) == 3
    [direct] = stand_in.entries("steady")
    assert direct["litellm_params"]["api_base"] == steady.engine_url + "/v1"
    # Straight to the engine, with the engine's own secret (deployments/engine_secrets.py).
    assert direct["litellm_params"]["api_key"] == steady.runtime_handle["replicas"][0]["secret"]
    assert stand_in.entries("st") and not stand_in.entries("broken")
    [held] = stand_in.entries("lazy")
    params, info = held["litellm_params"], held["model_info"]
    assert params["api_base"] == f"http://modelship.internal:8000/ondemand/{lazy.pk}/v1"
    assert params["api_key"] == "odk-first"
    assert (params["timeout"], params["stream_timeout"], params["num_retries"]) == (1500, 1500, 0)
    assert info["health_check_params"] == {"extra_headers": {"x-modelship-health-check": "1"}}
    assert info["modelship_id"] == lazy.pk and len(info["modelship_key_fp"]) == 12
    assert info["mode"] == "chat" and "/v1/chat/completions" in info["supported_endpoints"]
    # Nothing changed: nothing written.
    writes = stand_in.writes
    again = sync()
    assert again is not None and (again.added, again.deleted) == ([], [])
    assert stand_in.writes == writes
    # The API says so.

    api = APIClient()
    api.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    assert api.get("/api/host").json()["ondemand"]["litellm_ready"] is True
    assert api.get(f"/api/deployments/{lazy.pk}/").json()["litellm"] == "registered"


def test_it_keeps_the_name_listed_through_a_mode_switch_and_a_key_rotation(
    stand_in: StandIn, make_deployment: Callable[..., Deployment], tmp_path: Path
) -> None:

    switching = ready(make_deployment, "switching")
    sync()
    set_mode(switching, "on_demand", None)
    stand_in.timeline.clear()
    outcome = sync()
    assert outcome is not None and len(outcome.added) == 1 and len(outcome.deleted) == 1
    assert all("switching" in names for names in stand_in.timeline)  # adds before deletes
    [entry] = stand_in.entries("switching")
    assert "/ondemand/" in entry["litellm_params"]["api_base"]
    (tmp_path / "ondemand_key").write_text("odk-second")
    stand_in.timeline.clear()
    sync()
    [entry] = stand_in.entries("switching")
    assert entry["litellm_params"]["api_key"] == "odk-second"
    assert all("switching" in names for names in stand_in.timeline)


def test_it_leaves_on_demand_entries_alone_without_a_key(
    stand_in: StandIn, make_deployment: Callable[..., Deployment], tmp_path: Path
) -> None:
    lazy = make_deployment("lazy", mode="on_demand")
    sync()
    (tmp_path / "ondemand_key").unlink()
    outcome = sync()
    assert outcome is not None and outcome.deleted == []
    assert stand_in.entries("lazy")  # left as it was

    assert deployment_status(lazy.pk) == "ondemand_not_configured"


def test_it_loses_nothing_when_litellm_fails_mid_sync_and_repairs_next_time(
    stand_in: StandIn,
    make_deployment: Callable[..., Deployment],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in ("a", "b", "c"):
        make_deployment(name, mode="on_demand")
    sync()
    Deployment.objects.filter(name="a").delete()
    make_deployment("d", mode="on_demand")
    stand_in.fail_after = stand_in.writes  # it stops answering writes now
    with caplog.at_level(logging.WARNING, logger="ondemand.litellm"):
        first, second = sync(), sync()
    assert first is not None and first.error and second is not None and second.error
    assert len([r for r in caplog.records if "LiteLLM sync failed" in r.message]) == 1
    assert stand_in.entries("a")  # nothing deleted that it could not verify

    assert status_now()["litellm_ready"] is False
    stand_in.fail_after = None
    repaired = sync()
    assert repaired is not None and not repaired.error
    assert not stand_in.entries("a") and stand_in.entries("d")
    assert {m["model_name"] for m in stand_in.models.values()} == {"b", "c", "d"}


def test_it_reports_an_unreachable_litellm_and_deletes_nothing(
    stand_in: StandIn, make_deployment: Callable[..., Deployment], site: Any
) -> None:
    make_deployment("lazy", mode="on_demand")
    site.MSHIP_LITELLM_URL = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    outcome = sync()
    assert outcome is not None and "cannot be reached" in outcome.error


def test_it_prints_the_same_entries_as_a_static_model_list(
    stand_in: StandIn, make_deployment: Callable[..., Deployment], capsys: Any
) -> None:
    lazy = make_deployment("lazy", mode="on_demand")
    call_command("litellm_config")
    listed = yaml.safe_load(capsys.readouterr().out)["model_list"]
    sync()
    assert [e["model_info"]["id"] for e in listed] == list(stand_in.models)
    assert listed[0]["litellm_params"]["api_base"].endswith(f"/ondemand/{lazy.pk}/v1")
    call_command("sync_litellm")
    assert "unchanged" in capsys.readouterr().out


def test_it_replaces_an_entry_once_when_its_parameters_change(
    stand_in: StandIn, make_deployment: Callable[..., Deployment], site: Any
) -> None:
    lazy = make_deployment("lazy", mode="on_demand")
    sync()
    [before] = stand_in.entries("lazy")
    site.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = 1800  # LiteLLM's timeout for the entry follows it
    outcome = sync()
    assert outcome is not None and (len(outcome.added), len(outcome.deleted)) == (1, 1)
    [after] = stand_in.entries("lazy")
    assert after["model_info"]["modelship_params_fp"] != before["model_info"]["modelship_params_fp"]
    assert after["litellm_params"]["timeout"] == 2400
    assert after["model_info"]["modelship_id"] == lazy.pk
    writes = stand_in.writes
    again = sync()  # replaced once: the next sync writes nothing
    assert again is not None and (again.added, again.deleted) == ([], [])
    assert stand_in.writes == writes


def test_it_replaces_an_entry_whose_new_fingerprint_shares_the_ids_prefix(
    stand_in: StandIn,
    make_deployment: Callable[..., Deployment],
    site: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry's id carries six hex digits of each fingerprint; a changed setting whose
    fingerprint starts with the same six still replaces the entry, once."""
    make_deployment("lazy", mode="on_demand")
    sync()
    [before] = stand_in.entries("lazy")
    old = before["model_info"]["modelship_params_fp"]
    colliding = old[:6] + ("000000" if old[6:] != "000000" else "111111")
    monkeypatch.setattr(litellm, "fingerprint", lambda value: colliding)
    site.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = 1800
    outcome = sync()
    assert outcome is not None and not outcome.error
    [after] = stand_in.entries("lazy")
    assert after["model_info"]["id"] == before["model_info"]["id"]  # the same id
    assert after["model_info"]["modelship_params_fp"] == colliding
    assert after["litellm_params"]["timeout"] == 2400
    writes = stand_in.writes
    again = sync()
    assert again is not None and (again.added, again.deleted) == ([], [])
    assert stand_in.writes == writes
