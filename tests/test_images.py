"""Images through /v1 with the official SDK, on diffusers (CPU PyTorch, in the diffusers
engine environment) and a tiny Stable Diffusion pipeline made here (`make_tiny_model --kind
image`): generations and edits (with and without a mask) as real PNGs of the asked size,
seeds, data URLs, bad input; a client that hangs up stops the pipeline within a step; an
on-demand image model started by its first request and stopped when idle."""

from __future__ import annotations

import base64
import io
import json
import socket
import subprocess
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone
from PIL import Image

from deployments.models import Deployment, State
from tests.conftest import REPO, env_for_subprocess, reap, wait_until
from tests.gateway_support import seen_by_gateway
from tests.tiny_models import made

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.heavy]


@pytest.fixture(scope="module")
def tiny_sd(django_db_blocker: Any) -> Path:
    with django_db_blocker.unblock():  # the settings the command reads, not the database
        return made("image", seed=1, name="tiny-sd")


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)


@pytest.fixture
def painter(serving: Callable[..., Deployment], tiny_sd: Path) -> Deployment:
    return serving(
        "painter",
        loader="diffusers",
        usecase="image",
        model=str(tiny_sd),
        config={"num_inference_steps": 2},
    )


def png(b64: str | None) -> Image.Image:
    assert b64 is not None
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def metrics(deployment: Deployment) -> dict[str, float]:
    deployment.refresh_from_db()
    text = httpx.get(deployment.engine_url + "/metrics").text
    return {
        line.split()[0].removeprefix("modelship_image_"): float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_it_generates_pngs_of_the_asked_size(client: openai.OpenAI, painter: Deployment) -> None:
    made = client.images.generate(
        model="painter",
        prompt="a lighthouse at dawn",
        n=2,
        size="64x64",
        extra_body={"seed": 7},
    )
    images = [png(d.b64_json) for d in made.data or []]
    assert [(i.format, i.size) for i in images] == [("PNG", (64, 64))] * 2
    first, again = (
        client.images.generate(
            model="painter",
            prompt="a lighthouse at dawn",
            size="64x64",
            extra_body={"seed": 7},
        )
        for _ in range(2)
    )
    assert (again.data or [])[0].b64_json == (first.data or [])[0].b64_json  # a seed repeats
    wide = client.images.generate(model="painter", prompt="x", size="128x64")
    assert png((wide.data or [])[0].b64_json).size == (128, 64)
    as_url = client.images.generate(model="painter", prompt="x", response_format="url")
    url = str((as_url.data or [])[0].url)
    assert url.startswith("data:image/png;base64,")
    assert png(url.split(",", 1)[1]).size == (64, 64)  # the pipeline's own size by default


def test_it_paints_into_a_file_from_the_command_line(
    painter: Deployment, gateway_url: str, api_key: Callable[..., str], tmp_path: Path
) -> None:
    """`modelship run` on an image model writes the PNG it was given (-o)."""
    User.objects.create_superuser("ops", "o@example.com", "pw-123456")
    token = io.StringIO()
    call_command("api_token", "ops", stdout=token)
    env = env_for_subprocess(
        MODELSHIP_URL=gateway_url,
        MODELSHIP_TOKEN=token.getvalue().strip(),
        MODELSHIP_API_KEY=api_key(),
    )
    target = tmp_path / "lighthouse.png"
    painted = subprocess.run(
        [str(REPO / ".venv/bin/modelship"), "run", "painter", "a lighthouse", "-o", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert painted.returncode == 0, painted.stderr
    assert f"wrote {target}" in painted.stdout
    image = Image.open(target)
    assert (image.format, image.size) == ("PNG", (64, 64))


def test_it_edits_an_image_with_and_without_a_mask(
    client: openai.OpenAI, painter: Deployment
) -> None:
    source = io.BytesIO()
    Image.new("RGB", (96, 96), (200, 30, 30)).save(source, format="PNG")
    mask = io.BytesIO()
    Image.new("L", (96, 96), 255).save(mask, format="PNG")
    edited = client.images.edit(
        model="painter", image=("red.png", source.getvalue()), prompt="make it blue"
    )
    assert png((edited.data or [])[0].b64_json).size == (96, 96)  # the source's size
    masked = client.images.edit(
        model="painter",
        image=("red.png", source.getvalue()),
        mask=("mask.png", mask.getvalue()),
        prompt="a window",
        size="64x64",
    )
    assert png((masked.data or [])[0].b64_json).size == (64, 64)


def test_it_refuses_bad_requests_naming_what_it_takes(
    client: openai.OpenAI, painter: Deployment
) -> None:
    with pytest.raises(openai.BadRequestError) as size:
        client.images.generate(model="painter", prompt="x", size="65x65")
    assert "multiples of 8" in str(size.value)
    with pytest.raises(openai.BadRequestError):
        client.images.generate(model="painter", prompt="")
    with pytest.raises(openai.BadRequestError) as count:
        client.images.generate(model="painter", prompt="x", n=9)
    assert "from 1 to 4" in str(count.value)
    with pytest.raises(openai.BadRequestError) as not_image:
        client.images.edit(model="painter", image=("a.png", b"not an image"), prompt="x")
    assert "not an image" in str(not_image.value)
    assert metrics(painter)["requests_total"] == 0  # nothing refused reached the pipeline


def test_it_stops_the_pipeline_within_a_step_when_the_client_hangs_up(
    serving: Callable[..., Deployment],
    tiny_sd: Path,
    gateway_url: str,
    api_key: Callable[..., str],
) -> None:
    slow = serving(
        "slow-painter",
        loader="diffusers",
        usecase="image",
        model=str(tiny_sd),
        config={"num_inference_steps": 400},
    )
    body = json.dumps({"model": "slow-painter", "prompt": "a long one", "size": "64x64"})
    address = urlsplit(gateway_url)
    request = (
        "POST /v1/images/generations HTTP/1.1\r\nHost: modelship\r\n"
        f"Authorization: Bearer {api_key()}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )
    # The client hangs up once the pipeline is under way, however long it took to begin.
    with socket.create_connection((address.hostname or "127.0.0.1", address.port or 80)) as client:
        client.sendall(request.encode())
        wait_until(lambda: metrics(slow)["steps_total"] >= 1, 60)
    wait_until(lambda: metrics(slow)["cancelled_total"] == 1, 30)
    steps = metrics(slow)["steps_total"]
    assert 0 < steps < 400
    assert metrics(slow)["steps_total"] <= steps + 1  # and it stays stopped
    assert metrics(slow)["requests_running"] == 0


def test_it_starts_an_image_model_on_demand_and_stops_it_when_idle(
    client: openai.OpenAI, make_deployment: Any, tiny_sd: Path, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    lazy = make_deployment(
        "lazy-painter",
        loader="diffusers",
        usecase="image",
        model=str(tiny_sd),
        mode="on_demand",
        idle_timeout_s=60,
        config={"num_inference_steps": 2},
    )
    seen_by_gateway(lambda s: "lazy-painter" in s.routes)
    made = client.images.generate(model="lazy-painter", prompt="x", size="64x64")
    assert png((made.data or [])[0].b64_json).size == (64, 64)
    lazy.refresh_from_db()
    assert lazy.state == State.READY
    # Its lease runs out (as after a minute of no requests): the reaper stops it.
    Deployment.objects.filter(pk=lazy.pk).update(lease_until=timezone.now() - timedelta(1))
    assert reap(site) == "stopped: lazy-painter"
    lazy.refresh_from_db()
    assert lazy.state == State.STOPPED
