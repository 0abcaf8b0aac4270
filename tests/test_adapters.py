"""LoRA adapters on real llama.cpp: a GGUF adapter for the tiny model (written with the
gguf package) served by its own name from its base's engine, changing its answers while the
base answers as itself; keys, /v1/models, the base replaced when its adapters change, the
base started on demand for an adapter, and what an adapter cannot be or do."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from deployments import deployer, tasks
from deployments.models import Deployment, State
from deployments.tiny_model import write as write_tiny
from deployments.tiny_model import write_lora
from ondemand.litellm import plan
from tests.conftest import run_queue
from tests.gateway_support import OnDemandSite, seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")
HI: list[Any] = [{"role": "user", "content": "Say something about the weather."}]


@pytest.fixture
def files(site: Any, tmp_path: Path) -> dict[str, Path]:
    folder = (tmp_path / "models").resolve()
    site.MSHIP_MODEL_DIRS = [str(folder)]
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    return {
        "base": write_tiny(folder / "tiny.gguf"),
        "lora": write_lora(folder / "lora-a.gguf", seed=1),
        "other": write_lora(folder / "lora-b.gguf", seed=2),
    }


@pytest.fixture
def root(transactional_db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("root", "r@example.com", "pw-123456"))
    return client


def base_body(files: dict[str, Path], **more: Any) -> dict[str, Any]:
    return {
        "name": "tiny",
        "model": str(files["base"]),
        "loader": "llama_server",
        "memory_gib": 0.5,
        "config": {"n_ctx": 2048, "threads": 1},
        **more,
    }


def said(client: openai.OpenAI, model: str, **extra: Any) -> str:
    answer = client.chat.completions.create(
        model=model, messages=HI, max_tokens=8, temperature=0, extra_body=extra or None
    )
    return answer.choices[0].message.content or ""


def test_it_serves_an_adapter_by_its_own_name_from_its_base_engine(
    files: dict[str, Path],
    root: APIClient,
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    assert root.post("/api/deployments/", base_body(files), format="json").status_code == 201
    adapter = {"name": "tiny-poet", "model": str(files["lora"]), "adapter_of": "tiny"}
    made = root.post("/api/deployments/", adapter, format="json")
    assert made.status_code == 201, made.json()
    assert (made.json()["loader"], made.json()["adapter_of"]) == ("llama_server", "tiny")
    base = deployer.restart(Deployment.objects.get(name="tiny").pk)
    assert base.state == State.READY, base.state_reason
    seen_by_gateway(lambda s: s.routes.get("tiny-poet") and s.routes["tiny-poet"].state == "ready")
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    plain, poet = said(client, "tiny"), said(client, "tiny-poet")
    assert plain and poet and plain != poet  # the adapter changes what it says
    assert said(client, "tiny") == plain  # and the base answers as itself again
    # A caller of the base cannot switch an adapter on itself, whatever the body's type says.
    assert said(client, "tiny", lora=[{"id": 0, "scale": 1.0}]) == plain
    sneaky = {"model": "tiny", "messages": HI, "max_tokens": 8, "temperature": 0}
    mixed = httpx.post(
        gateway_url + "/v1/chat/completions",
        content=json.dumps({**sneaky, "lora": [{"id": 0, "scale": 1.0}]}),
        headers={"authorization": f"Bearer {api_key()}", "content-type": "multipart/mixed"},
        timeout=60,
    )
    assert mixed.json()["choices"][0]["message"]["content"] == plain
    listed = {m.id: m for m in client.models.list().data}
    assert listed["tiny-poet"].model_extra == {"parent": "tiny"}
    # Its own keys: one for the adapter only reaches the adapter.
    only = openai.OpenAI(
        base_url=gateway_url + "/v1",
        api_key=api_key("poet", allowed_models=["tiny-poet"]),
        max_retries=0,
    )
    assert said(only, "tiny-poet") == poet
    with pytest.raises(openai.NotFoundError):
        said(only, "tiny")
    assert only.models.retrieve("tiny-poet").model_extra == {}  # its base is not its to know
    # Refusals: no engine of its own, not deleted from under.
    poet_id = made.json()["id"]
    assert root.post(f"/api/deployments/{poet_id}/start/").status_code == 409
    refused = root.delete(f"/api/deployments/{base.pk}/")
    assert refused.status_code == 409 and "tiny-poet" in refused.json()["detail"]
    assert not tasks.remove(base.pk)  # a reconciling file's removal keeps it too
    assert Deployment.objects.get(pk=base.pk).state == State.READY
    # An adapter stays one, of its base; a base keeps its loader while it has adapters.
    moved = root.patch(f"/api/deployments/{poet_id}/", {"adapter_of": None}, format="json")
    assert moved.status_code == 400 and "set when a deployment is made" in str(moved.json())
    other = root.patch(f"/api/deployments/{base.pk}/", {"loader": "vllm"}, format="json")
    assert other.status_code == 400 and "has adapters" in str(other.json())


def test_it_replaces_a_running_base_whose_adapters_change(
    files: dict[str, Path], root: APIClient, gateway_url: str, api_key: Callable[..., str]
) -> None:
    root.post("/api/deployments/", base_body(files), format="json")
    base = deployer.restart(Deployment.objects.get(name="tiny").pk)
    assert base.state == State.READY, base.state_reason
    run_queue()
    adapter = {"name": "tiny-b", "model": str(files["other"]), "adapter_of": "tiny"}
    assert root.post("/api/deployments/", adapter, format="json").status_code == 201
    seen_by_gateway(lambda s: "tiny-b" in s.routes)
    assert [name for name, _ in run_queue()] == ["replace"]  # the base, with its adapter
    seen_by_gateway(lambda s: s.routes["tiny-b"].state == "ready")
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    assert said(client, "tiny-b") != said(client, "tiny")


def test_it_starts_an_on_demand_base_for_its_adapters_request(
    files: dict[str, Path],
    root: APIClient,
    gateway_url: str,
    api_key: Callable[..., str],
    ondemand_site: OnDemandSite,
) -> None:
    body = base_body(files, mode="on_demand", idle_timeout_s=60)
    assert root.post("/api/deployments/", body, format="json").status_code == 201
    adapter = {"name": "tiny-poet", "model": str(files["lora"]), "adapter_of": "tiny"}
    assert root.post("/api/deployments/", adapter, format="json").status_code == 201
    seen_by_gateway(lambda s: "tiny-poet" in s.routes)
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={"model": "tiny-poet", "messages": HI, "max_tokens": 8, "temperature": 0},
        headers={"authorization": f"Bearer {api_key()}"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    base = Deployment.objects.get(name="tiny")
    assert base.state == State.READY
    # LiteLLM registers the adapter at its base's /ondemand path, which applies it too.
    entries = plan("http://modelship:8000", "odk-x").entries.values()
    poet = next(e for e in entries if e["model_name"] == "tiny-poet")
    assert poet["litellm_params"]["api_base"] == f"http://modelship:8000/ondemand/{base.pk}/v1"
    client = ondemand_site.sdk(base)
    via_ondemand = client.chat.completions.create(
        model="tiny-poet", messages=HI, max_tokens=8, temperature=0
    )
    first = answer.json()["choices"][0]["message"]["content"]
    assert via_ondemand.choices[0].message.content == first  # the adapter's, both ways
    plain = client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0)
    assert plain.choices[0].message.content != via_ondemand.choices[0].message.content


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"model": "BASE"}, "model", "is not a GGUF LoRA adapter"),
        ({"loader": "vllm"}, "loader", "an adapter's loader is its base's"),
        ({"adapter_of": "tiny-poet"}, "adapter_of", "is an adapter itself"),
        ({"command": ["sh"]}, "command", "set it on the base"),
    ],
)
def test_it_refuses_what_an_adapter_cannot_be(
    files: dict[str, Path], root: APIClient, change: dict[str, Any], field: str, words: str
) -> None:
    root.post("/api/deployments/", base_body(files), format="json")
    poet = {"name": "tiny-poet", "model": str(files["lora"]), "adapter_of": "tiny"}
    assert root.post("/api/deployments/", poet, format="json").status_code == 201
    body = {**poet, "name": "other", **change}
    if body["model"] == "BASE":
        body["model"] = str(files["base"])
    refused = root.post("/api/deployments/", body, format="json")
    assert refused.status_code == 400, refused.json()
    assert any(words in text for text in refused.json()[field]), refused.json()


def test_it_takes_a_base_and_its_adapter_from_one_models_yaml(
    files: dict[str, Path], root: APIClient
) -> None:
    text = f"""models:
  - name: tiny-poet
    model: {files["lora"]}
    adapter_of: tiny
  - name: tiny
    model: {files["base"]}
    loader: llama_server
    memory_gib: 0.5
    mode: on_demand
"""
    applied = root.post("/api/apply", {"file": text}, format="json")
    assert applied.status_code == 200, applied.json()
    poet = Deployment.objects.get(name="tiny-poet")
    assert poet.adapter_of is not None and poet.adapter_of.name == "tiny"
    assert poet.loader == "llama_server"
    unknown = text.replace("adapter_of: tiny", "adapter_of: nobody")
    refused = root.post("/api/apply", {"file": unknown}, format="json")
    assert refused.status_code == 400
    assert "adapter_of: no deployment 'nobody'" in str(refused.json())


def test_it_checks_a_vllm_adapters_folder_and_rank(
    files: dict[str, Path], root: APIClient, make_deployment: Callable[..., Deployment]
) -> None:
    make_deployment("big", loader="vllm", model=str(files["base"].parent), memory_gib=3)
    folder = files["base"].parent / "peft"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 128, "peft_type": "LORA"}')
    adapter = {"name": "big-lora", "model": str(folder), "adapter_of": "big"}
    refused = root.post("/api/deployments/", adapter, format="json")
    assert refused.status_code == 400
    assert refused.json()["model"] == ["its rank 128 is above the base's max_lora_rank 64"]
    (folder / "adapter_config.json").write_text('{"r": 16, "peft_type": "LORA"}')
    made = root.post("/api/deployments/", adapter, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["loader"] == "vllm"
    gguf = {**adapter, "name": "big-gguf", "model": str(files["lora"])}
    assert (
        "adapter_config.json"
        in root.post("/api/deployments/", gguf, format="json").json()["model"][0]
    )
