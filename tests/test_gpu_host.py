"""A GPU host, declared with MSHIP_GPU_INVENTORY, and simulated engines that report the
CUDA_VISIBLE_DEVICES and model cache they were given: placement per device, tensor parallel
started first, wakes where an engine ran, adoption reading the devices back, the shared
model cache."""

from __future__ import annotations

import functools
import re
import time
from io import StringIO
from typing import TYPE_CHECKING, Any

import docker
import httpx
import openai
import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from deployments import deployer
from deployments.adoption import adopt_all
from deployments.memory import InsufficientMemory
from deployments.models import Deployment, State
from ondemand.registry import controllers
from tests.conftest import in_thread, wait_until
from tests.docker_support import docker_block

if TYPE_CHECKING:
    from pathlib import Path

    from tests.registry_support import Registry
from tests.test_ondemand_v1 import ask, on_demand

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def gpu_host(site: Any, tmp_path: Path) -> Any:
    """Two GPUs of 10 GiB."""
    site.MSHIP_GPU_INVENTORY = [(0, 10.0), (1, 10.0)]
    site.MSHIP_HF_HOME = tmp_path / "hf-cache"
    return site


@pytest.fixture
def api(transactional_db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    return client


def seen_by_engine(deployment: Deployment) -> list[dict[str, Any]]:
    """What each replica's engine says it was given (/sim/env)."""
    deployment.refresh_from_db()
    return [httpx.get(url + "/sim/env").json() for url in deployment.engine_urls]


def placed(make_deployment: Any, name: str, **fields: Any) -> Deployment:
    deployment: Deployment = make_deployment(name, **{"memory_gib": None, **fields})
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    return deployment


def test_it_places_two_nine_tenths_deployments_on_two_gpus_and_refuses_a_third(
    gpu_host: Any, make_deployment: Any, api: APIClient
) -> None:
    first = placed(make_deployment, "first", num_gpus=0.9)
    second = placed(make_deployment, "second", num_gpus=0.9)
    assert (first.gpus, second.gpus) == ([[0]], [[1]])
    seen = seen_by_engine(first)[0]
    assert (seen["CUDA_VISIBLE_DEVICES"], seen["CUDA_DEVICE_ORDER"]) == ("0", "PCI_BUS_ID")
    assert seen_by_engine(second)[0]["CUDA_VISIBLE_DEVICES"] == "1"
    assert api.get(f"/api/deployments/{first.pk}/").json()["gpus"] == [[0]]

    third = make_deployment("third", memory_gib=None, num_gpus=0.9)
    answer = api.post(f"/api/deployments/{third.pk}/start/")
    assert answer.status_code == 409
    body = answer.json()
    assert body["code"] == "insufficient_memory"
    assert body["gpus"] == [
        {"index": 0, "need_gib": 9.0, "free_gib": 1.0, "short_gib": 8.0},
        {"index": 1, "need_gib": 9.0, "free_gib": 1.0, "short_gib": 8.0},
    ]
    assert "no GPU with room for it now: GPU 0 has 1 GiB free (short by 8)" in body["detail"]

    host = api.get("/api/host").json()
    assert host["placement"] == "per GPU (pack)"
    assert [(g["index"], g["held_gib"], g["free_gib"], g["used_gib"]) for g in host["gpus"]] == [
        (0, 9.0, 1.0, None),
        (1, 9.0, 1.0, None),
    ]
    assert [d["name"] for d in host["gpus"][1]["deployments"]] == ["second"]

    # The first stops: its GPU is free again, and the third goes there.
    deployer.stop(first.pk)
    first.refresh_from_db()
    assert first.gpus == []
    assert placed(make_deployment, "fourth", num_gpus=0.9).gpus == [[0]]


def test_it_refuses_at_validation_what_this_host_can_never_hold(
    gpu_host: Any, api: APIClient
) -> None:
    base = {"model": "simulated", "loader": "simulated", "runtime": "process"}
    three = api.post("/api/deployments/", {**base, "name": "wide", "num_gpus": 3}, format="json")
    assert three.status_code == 400
    assert three.json() == {"num_gpus": ["needs 3 GPUs, this host has 2"]}
    huge = api.post("/api/deployments/", {**base, "name": "huge", "memory_gib": 12}, format="json")
    assert huge.status_code == 400
    assert huge.json() == {"memory_gib": ["needs 12 GiB on one GPU, the largest here has 10 GiB"]}
    assert not Deployment.objects.exists()


def test_it_starts_tensor_parallel_first_on_whole_free_gpus(
    gpu_host: Any, tmp_path: Path, transactional_db: None
) -> None:
    gpu_host.MSHIP_GPU_INVENTORY = [(i, 10.0) for i in range(4)]
    lines = ["models:"]
    for name, memory in [
        ("small", "memory_gib: 4"),
        ("wide", "num_gpus: 2"),
        ("other", "memory_gib: 4"),
    ]:
        lines += [
            f"  - name: {name}",
            "    model: simulated",
            "    loader: simulated",
            f"    {memory}",
        ]
    models = tmp_path / "models.yaml"
    models.write_text("\n".join(lines) + "\n")
    out = StringIO()
    call_command("deploy", "-f", str(models), "--wait", stdout=out)
    started = [line.split(":")[0] for line in out.getvalue().splitlines() if "ready" in line]
    assert started == ["wide", "small", "other"]  # tensor parallel first, then the file's order
    gpus = {d.name: d.gpus for d in Deployment.objects.all()}
    # Two whole GPUs for the wide one; the small ones packed onto one of the others.
    assert gpus == {"wide": [[0, 1]], "small": [[2]], "other": [[2]]}
    assert seen_by_engine(Deployment.objects.get(name="wide"))[0]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_it_wakes_a_sleeping_engine_only_where_it_ran(gpu_host: Any, make_deployment: Any) -> None:
    sleepy = placed(make_deployment, "sleepy", memory_gib=6, config={"enable_sleep_mode": True})
    assert sleepy.gpus == [[0]]
    deployer.sleep(sleepy.pk)
    sleepy.refresh_from_db()
    assert (sleepy.state, sleepy.gpus) == (State.ASLEEP, [[0]])  # kept: it wakes there
    # Asleep, it holds nothing: another takes GPU 0's room, and GPU 1 stays free.
    assert placed(make_deployment, "taker", memory_gib=6).gpus == [[0]]
    with pytest.raises(InsufficientMemory) as refused:
        deployer.wake(sleepy.pk)  # GPU 1 has room, but the engine's CUDA context is on GPU 0
    assert [(g.index, g.short_gib) for g in refused.value.devices] == [(0, 2.0)]


def test_it_reads_each_engines_gpus_back_when_it_adopts_them(
    gpu_host: Any, make_deployment: Any
) -> None:
    first = placed(make_deployment, "first", memory_gib=6)
    second = placed(make_deployment, "second", memory_gib=6)
    assert (first.gpus, second.gpus) == ([[0]], [[1]])
    # A row that lost them (written by an older Modelship): the engine's environment says.
    Deployment.objects.filter(pk=second.pk).update(gpus=[])
    outcome = adopt_all()
    assert sorted(outcome["adopted"]) == ["first", "second"]
    second.refresh_from_db()
    assert second.gpus == [[1]]


def test_it_runs_an_engine_placed_on_no_gpu_with_none_visible(
    gpu_host: Any, make_deployment: Any
) -> None:
    cpu = placed(make_deployment, "cpu", num_gpus=0)
    assert cpu.gpus == []
    seen = seen_by_engine(cpu)[0]
    assert (seen["CUDA_VISIBLE_DEVICES"], seen["NVIDIA_VISIBLE_DEVICES"]) == ("", "void")


def test_it_shares_one_model_cache_so_a_second_wake_downloads_nothing(
    gpu_host: Any, make_deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    hub = make_deployment("hub", model="org/some-model", memory_gib=2, config={"download": True})
    deployer.restart(hub.pk)
    seen = seen_by_engine(hub)[0]
    assert seen["weights"] == "downloaded"
    assert seen["HF_HOME"] == str(gpu_host.MSHIP_HF_HOME)
    assert seen["has_hf_token"] is True
    assert (gpu_host.MSHIP_HF_HOME / "hub" / "models--org--some-model").is_dir()
    deployer.stop(hub.pk)
    deployer.restart(hub.pk)
    assert seen_by_engine(hub)[0]["weights"] == "cached"


@pytest.mark.usefixtures("docker_site")
def test_it_asks_docker_for_the_placed_device_ids_and_mounts_the_cache(
    gpu_host: Any, make_deployment: Any, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    placed(make_deployment, "first", memory_gib=6)  # a process engine takes GPU 0
    created: list[dict[str, Any]] = []
    start = docker.models.containers.Container.start

    def inspect_then_start(container: Any, **kwargs: Any) -> Any:
        container.reload()
        created.append(container.attrs)
        return start(container, **kwargs)

    monkeypatch.setattr(docker.models.containers.Container, "start", inspect_then_start)
    boxed = make_deployment("boxed", runtime="docker", memory_gib=6, docker_options=docker_block())
    deployer.restart(boxed.pk)
    box = created[0]
    assert box["Config"]["Labels"]["modelship.gpus"] == "1"
    requests = box["HostConfig"]["DeviceRequests"]
    assert [(r["DeviceIDs"], r["Capabilities"]) for r in requests] == [(["1"], [["gpu"]])]
    cache = str(gpu_host.MSHIP_HF_HOME)
    assert f"{cache}:{cache}:rw" in box["HostConfig"]["Binds"]
    assert f"HF_HOME={cache}" in box["Config"]["Env"]
    # This daemon has no NVIDIA runtime: the start fails with its own words, and GPU 1 is
    # free again.
    boxed.refresh_from_db()
    assert boxed.state == State.FAILED
    assert "gpu" in boxed.state_reason.lower()
    assert boxed.gpus == []


@pytest.mark.usefixtures("docker_site")
def test_it_keeps_a_containers_downloads_in_the_hosts_cache(
    site: Any, tmp_path: Path, make_deployment: Any
) -> None:
    site.MSHIP_HF_HOME = tmp_path / "hf-cache"
    hub = make_deployment(
        "hub",
        runtime="docker",
        model="org/boxed-model",
        config={"download": True},
        docker_options=docker_block(),
    )
    deployer.restart(hub.pk)
    assert seen_by_engine(hub)[0]["weights"] == "downloaded"
    assert (site.MSHIP_HF_HOME / "hub" / "models--org--boxed-model").is_dir()
    deployer.stop(hub.pk)
    deployer.restart(hub.pk)  # a new container: the weights are where the last one left them
    assert seen_by_engine(hub)[0]["weights"] == "cached"


def test_it_checks_placement_with_two_halves_of_one_gpu(gpu_host: Any) -> None:
    out = StringIO()
    call_command("gpu_check", "--place-demo", stdout=out)
    shown = out.getvalue()
    assert "gpu-check-a: placed on GPU 0, the engine sees CUDA_VISIBLE_DEVICES='0'" in shown
    assert "gpu-check-b: placed on GPU 0, the engine sees CUDA_VISIBLE_DEVICES='0'" in shown
    assert "gpu-check-a 5.0  gpu-check-b 5.0" in shown  # both on GPU 0's row of the table
    assert not Deployment.objects.exists()  # removed after


@pytest.mark.usefixtures("docker_site")
def test_it_pulls_an_image_outside_the_start_gate_with_its_progress(
    make_deployment: Any, slow_registry: Registry, tmp_path: Path
) -> None:
    entry = {
        "name": "pulled",
        "model": "simulated",
        "loader": "simulated",
        "runtime": "docker",
        "image": slow_registry.image,
        "memory_gib": 1,
        "docker": docker_block(),
    }
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({"models": [entry]}))
    told = StringIO()
    deploy = functools.partial(call_command, stdout=told)
    deploying = in_thread(deploy, "deploy", "-f", str(models), "--wait")
    assert slow_registry.sending.wait(30)
    # While the image comes, another deployment starts: the pull does not hold the gate.
    other = placed(make_deployment, "other", memory_gib=1)
    assert other.state == State.READY and not slow_registry.sent.is_set()
    reasons: list[str] = []
    pulled = Deployment.objects.get(name="pulled")
    while deploying.is_alive():
        reason = Deployment.objects.get(pk=pulled.pk).state_reason
        if reason.startswith("pulling image") and reason not in reasons:
            reasons.append(reason)
        time.sleep(0.1)
    pulled.refresh_from_db()
    assert pulled.state == State.READY, pulled.state_reason
    assert len(reasons) >= 2, reasons  # a 4 s pull, told at most once a second
    assert all(f"pulling image {slow_registry.image}: " in r for r in reasons)
    assert re.search(r"\d+ of 2 layers, [\d.]+ of [\d.]+ MB", reasons[-1]), reasons
    # deploy --wait told the operator as it went.
    assert f"pulled: pulling image {slow_registry.image}: " in told.getvalue()
    assert "pulled: ready ready" in told.getvalue()


@pytest.mark.usefixtures("docker_site")
def test_it_says_an_image_no_registry_has_is_not_found(
    make_deployment: Any, slow_registry: Registry
) -> None:
    missing = slow_registry.image.replace("mstest/slow", "mstest/absent")
    boxed = make_deployment(
        "absent", runtime="docker", image=missing, docker_options=docker_block()
    )
    deployer.restart(boxed.pk)
    boxed.refresh_from_db()
    assert boxed.state == State.FAILED
    assert boxed.state_reason.startswith(f"image {missing!r} not found in any configured registry")


def test_it_makes_room_on_the_gpu_the_start_needs_and_spares_the_others(
    gpu_host: Any, gateway_url: str, api_key: Any, make_deployment: Any
) -> None:
    """GPU 0 has 10 GiB, GPU 1 5: the least recently used model sits on GPU 1, where an 8 GiB
    model can never go; only the one on GPU 0 is stopped for it."""
    gpu_host.MSHIP_GPU_INVENTORY = [(0, 10.0), (1, 5.0)]
    older = on_demand(make_deployment, gpu_host, "older", memory_gib=4)
    newer = on_demand(make_deployment, gpu_host, "newer", memory_gib=6)
    on_demand(make_deployment, gpu_host, "big", memory_gib=8)
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    for model in ("older", "newer"):
        assert ask(client, model)
    assert [Deployment.objects.get(pk=d.pk).gpus for d in (older, newer)] == [[[1]], [[0]]]
    # Both long idle, the older the longer (in the controllers' memory and on the leases).
    wait_until(
        lambda: all(c.entry(d.pk).inflight == 0 for c in controllers() for d in (older, newer))
    )
    for ctl in controllers():
        ctl.entry(older.pk).idle_since -= 7200
        ctl.entry(newer.pk).idle_since -= 3600
    Deployment.objects.filter(pk__in=[older.pk, newer.pk]).update(lease_until=timezone.now())
    assert ask(client, "big")
    states = {d.name: (d.state, d.gpus) for d in Deployment.objects.all()}
    assert states == {
        "older": (State.READY, [[1]]),  # spared: stopping it frees nothing GPU 0 could use
        "newer": (State.STOPPED, []),
        "big": (State.READY, [[0]]),
    }
    assert Deployment.objects.get(pk=newer.pk).state_reason == "Put to sleep to make room for big"


def test_it_shows_each_gpu_and_each_deployments_gpus_in_the_admin(
    gpu_host: Any, make_deployment: Any, client: Any
) -> None:
    wide = placed(make_deployment, "wide", num_gpus=2)
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw-123456"))
    page = client.get("/admin/deployments/deployment/").content.decode()
    assert 'id="host-gpus"' in page and "2 GPUs, placed per GPU" in page
    assert page.count("wide 10.0") == 2  # on both GPUs' rows
    # Under its memory, held / needs: the GPUs it was placed on.
    cell = f'<span data-live="gpus" data-id="{wide.pk}">0, 1</span>'
    assert cell in page.split('class="field-memory"', 1)[1]


@pytest.mark.usefixtures("docker_site")
def test_it_reads_a_containers_gpus_back_from_its_label(
    gpu_host: Any, make_deployment: Any, docker_client: Any
) -> None:
    """A container placed on no GPU (one asking for a GPU cannot start on this daemon)."""
    boxed = make_deployment(
        "boxed", runtime="docker", memory_gib=None, num_gpus=0, docker_options=docker_block()
    )
    deployer.restart(boxed.pk)
    boxed.refresh_from_db()
    assert (boxed.state, boxed.gpus) == (State.READY, [])
    box = docker_client.containers.get(boxed.runtime_handle["replicas"][0]["container_id"])
    assert box.labels["modelship.gpus"] == ""
    assert not box.attrs["HostConfig"]["DeviceRequests"]
    Deployment.objects.filter(pk=boxed.pk).update(gpus=[[1]])  # a stale row
    assert adopt_all()["adopted"] == ["boxed"]
    boxed.refresh_from_db()
    assert boxed.gpus == []  # as the container's label says


def test_it_keeps_to_the_loaded_model_cap_per_gpu(
    gpu_host: Any, gateway_url: str, api_key: Any, make_deployment: Any
) -> None:
    """One engine per GPU: the second model goes on the other GPU though the first has room;
    a third makes room by stopping the least recently used; an always-on one is refused."""
    gpu_host.MSHIP_MAX_LOADED_PER_GPU = 1
    first = on_demand(make_deployment, gpu_host, "first", memory_gib=2)
    second = on_demand(make_deployment, gpu_host, "second", memory_gib=2)
    on_demand(make_deployment, gpu_host, "third", memory_gib=2)
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    for model in ("first", "second"):
        assert ask(client, model)
    gpus = [Deployment.objects.get(pk=d.pk).gpus for d in (first, second)]
    assert sorted(gpus) == [[[0]], [[1]]]  # pack would have put both on one GPU
    pinned = make_deployment("pinned", memory_gib=2)
    with pytest.raises(InsufficientMemory) as refused:
        deployer.restart(pinned.pk)
    assert "hold 1 engines, the most MSHIP_MAX_LOADED_PER_GPU allows" in str(refused.value)
    wait_until(
        lambda: all(c.entry(d.pk).inflight == 0 for c in controllers() for d in (first, second))
    )
    for ctl in controllers():
        ctl.entry(first.pk).idle_since -= 7200
    assert ask(client, "third")
    states = {d.name: (d.state, d.gpus) for d in Deployment.objects.exclude(name="pinned")}
    assert states["first"] == (State.STOPPED, [])
    assert states["third"] == (State.READY, gpus[0])  # where the first was
    assert states["second"] == (State.READY, gpus[1])
