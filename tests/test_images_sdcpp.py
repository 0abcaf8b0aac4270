"""Images through /v1 with the official SDK on stable-diffusion.cpp (its Python binding,
built from source into the sdcpp engine environment) and a Stable Diffusion 1.5 of random
weights made here (`make_tiny_model --kind sd15-random`, 2 GB: stable-diffusion.cpp takes
no tiny model): PNGs and JPEGs of the asked size, seeds, edits with and without a mask, the
shared image checks; a model stable-diffusion.cpp does not know fails the start in its words.
A heavy engine suite: it runs once, not once per database."""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any

import openai
import pytest
from PIL import Image

from deployments import deployer
from deployments.loaders import EngineSpec, get_loader
from deployments.models import Deployment, State
from tests.test_images import metrics
from tests.tiny_models import made

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.heavy]


@pytest.fixture(scope="module")
def sd15(django_db_blocker: Any) -> Path:
    with django_db_blocker.unblock():  # the settings the command reads, not the database
        return made("sd15-random", seed=1, name="sd15-random")


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)


@pytest.fixture
def painter(serving: Callable[..., Deployment], sd15: Path) -> Deployment:
    return serving(
        "sd-painter",
        loader="stable_diffusion_cpp",
        usecase="image",
        model=str(sd15),
        config={"sample_steps": 2, "threads": 2},
    )


def image_of(b64: str | None) -> Image.Image:
    assert b64 is not None
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def test_it_generates_and_edits_images_on_stable_diffusion_cpp(
    client: openai.OpenAI, painter: Deployment
) -> None:
    first = client.images.generate(
        model="sd-painter", prompt="a lighthouse", size="64x64", extra_body={"seed": 7}
    )
    again = client.images.generate(
        model="sd-painter", prompt="a lighthouse", size="64x64", extra_body={"seed": 7}
    )
    a, b = image_of((first.data or [])[0].b64_json), image_of((again.data or [])[0].b64_json)
    assert a.format == "PNG" and a.size == (64, 64)
    assert a.tobytes() == b.tobytes()  # the same seed, the same image
    wide = client.images.generate(
        model="sd-painter",
        prompt="a harbour",
        size="128x64",
        extra_body={"output_format": "jpeg", "seed": 1},
    )
    jpeg = image_of((wide.data or [])[0].b64_json)
    assert jpeg.format == "JPEG" and jpeg.size == (128, 64)
    source = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(source, format="PNG")
    mask = io.BytesIO()
    Image.new("L", (64, 64), 255).save(mask, format="PNG")
    edited = client.images.edit(
        model="sd-painter",
        image=("red.png", source.getvalue()),
        mask=("mask.png", mask.getvalue()),
        prompt="a window",
    )
    assert image_of((edited.data or [])[0].b64_json).size == (64, 64)
    with pytest.raises(openai.BadRequestError) as size:
        client.images.generate(model="sd-painter", prompt="x", size="96x96")
    assert "multiples of 64" in str(size.value)  # stable-diffusion.cpp would make 128x128
    counted = metrics(painter)
    assert counted["requests_total"] == 4 and counted["steps_total"] >= 8


def test_it_fails_the_start_of_a_model_stable_diffusion_cpp_does_not_know(
    make_deployment: Any, django_db_blocker: Any
) -> None:
    tiny = made("image", seed=1, name="tiny-sd")  # a real pipeline, of no size sd.cpp knows
    loader = get_loader("stable_diffusion_cpp")
    spec = EngineSpec("bad", str(tiny), usecase="image", config={"sample_steps": 0})
    assert any("sample_steps is 1 to 999" in issue for issue in loader.validate(spec))
    deployment = make_deployment(
        "bad-painter", loader="stable_diffusion_cpp", usecase="image", model=str(tiny)
    )
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED
    assert "cannot be loaded" in deployment.state_reason
    assert "get sd version from file failed" in deployment.state_reason  # its own words
