"""Images with Hugging Face diffusers at OpenAI's /v1/images/generations and
/v1/images/edits, in the diffusers engine environment.

The pipeline (`AutoPipelineForText2Image`, a model folder on this host: nothing is
downloaded) loads before the port opens, in float32 on a CPU and float16 on CUDA unless
`torch_dtype` says otherwise. Edits run the same weights as image-to-image, or inpainting
where a mask is given. One image request at a time, the others queued in order; a client
that leaves stops its pipeline at the next step. `response_format: url` is answered with a
data URL (there is no file host). /metrics counts steps, requests and cancellations, and
shows the requests running and waiting (the on-demand reaper's load signal).

Run: ``python -m deployments.engines.diffusers_server --model var/models/tiny-sd``
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from deployments.engines.common import engine_app, error, json_body, run_engine

MAX_IMAGES = 4
log = logging.getLogger("diffusers-engine")
FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}


class Cancelled(Exception):
    """The client left: the pipeline stops at its next step."""


@dataclass
class Counters:
    steps: int = 0
    requests: int = 0
    cancelled: int = 0
    running: int = 0
    waiting: int = 0

    def text(self) -> str:
        prefix = "modelship_image_"
        return "".join(
            f"# TYPE {prefix}{name} {kind}\n{prefix}{name} {value}\n"
            for name, kind, value in (
                ("steps_total", "counter", self.steps),
                ("requests_total", "counter", self.requests),
                ("cancelled_total", "counter", self.cancelled),
                ("requests_running", "gauge", self.running),
                ("requests_waiting", "gauge", self.waiting),
            )
        )


class Pipelines:
    """The text-to-image pipeline and, sharing its weights, image-to-image and inpainting."""

    def __init__(self, model: str, config: dict[str, Any]) -> None:
        import torch  # noqa: PLC0415 - the diffusers environment's
        from diffusers import (  # noqa: PLC0415 - as torch
            AutoPipelineForImage2Image,
            AutoPipelineForInpainting,
            AutoPipelineForText2Image,
        )

        self.torch = torch
        device = config.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        default_dtype = "float16" if device.startswith("cuda") else "float32"
        dtype = getattr(torch, str(config.get("torch_dtype") or default_dtype))
        try:
            text = AutoPipelineForText2Image.from_pretrained(model, torch_dtype=dtype)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"diffusers: {model} is not a pipeline here: {exc}") from exc
        self.text = text.to(device)
        self.text.set_progress_bar_config(disable=True)
        self.image = AutoPipelineForImage2Image.from_pipe(self.text)
        self.inpaint = AutoPipelineForInpainting.from_pipe(self.text)
        for pipeline in (self.image, self.inpaint):
            pipeline.set_progress_bar_config(disable=True)
        self.device = device
        scale = getattr(self.text, "vae_scale_factor", 8)
        self.default_size = int(self.text.unet.config.sample_size) * int(scale)
        self.size_step = 8
        self.steps = int(config.get("num_inference_steps", 4))
        self.guidance = float(config.get("guidance_scale", 0.0))

    def run(self, job: Job, counters: Counters, gone: threading.Event) -> list[Any]:
        def on_step(pipe: Any, step: int, timestep: Any, kwargs: dict[str, Any]) -> Any:
            counters.steps += 1
            if gone.is_set():
                raise Cancelled
            return kwargs

        generator = None
        if job.seed is not None:
            generator = self.torch.Generator(device="cpu").manual_seed(job.seed)
        options: dict[str, Any] = {
            "prompt": job.prompt,
            "num_images_per_prompt": job.n,
            "num_inference_steps": self.steps,
            "guidance_scale": self.guidance,
            "generator": generator,
            "callback_on_step_end": on_step,
        }
        if job.source is None:
            result = self.text(width=job.width, height=job.height, **options)
        elif job.mask is None:
            source = job.source.resize((job.width, job.height))
            # Image to image runs strength x steps: all of them, as a text-to-image would.
            result = self.image(image=source, strength=1.0, **options)
        else:
            size = (job.width, job.height)
            result = self.inpaint(
                image=job.source.resize(size),
                mask_image=job.mask.resize(size),
                width=job.width,
                height=job.height,
                strength=1.0,
                **options,
            )
        return list(result.images)


@dataclass
class Job:
    prompt: str
    n: int
    width: int
    height: int
    response_format: str
    output_format: str
    seed: int | None
    source: Any = None  # a PIL image for an edit
    mask: Any = None


def parse_size(size: str, default: int, step: int = 8) -> tuple[int, int]:
    if size in ("", "auto"):
        return default, default
    width, _, height = size.partition("x")
    w, h = int(width), int(height)
    if not (64 <= w <= 2048 and 64 <= h <= 2048) or w % step or h % step:
        raise ValueError
    return w, h


def job_of(fields: dict[str, Any], default_size: int, step: int = 8) -> Job:
    """A request's fields, checked; ValueError names what is wrong and what is taken."""
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("'prompt' must be a non-empty string.")
    response_format = fields.get("response_format") or "b64_json"
    if response_format not in ("b64_json", "url"):
        raise ValueError("response_format is b64_json or url (a data URL).")
    output_format = fields.get("output_format") or "png"
    if output_format not in FORMATS:
        raise ValueError(f"output_format is one of {', '.join(FORMATS)}.")
    try:
        n = int(fields.get("n") or 1)
        seed = None if fields.get("seed") in (None, "") else int(fields["seed"])
    except (TypeError, ValueError) as exc:
        raise ValueError("'n' and 'seed' are integers.") from exc
    if not 1 <= n <= MAX_IMAGES:
        raise ValueError(f"'n' must be from 1 to {MAX_IMAGES}.")
    try:
        width, height = parse_size(str(fields.get("size") or "auto"), default_size, step)
    except ValueError as exc:
        raise ValueError(
            f"'size' is auto or WIDTHxHEIGHT, 64 to 2048 and multiples of {step} (e.g. 512x512)."
        ) from exc
    return Job(prompt, n, width, height, response_format, output_format, seed)


def picture(data: bytes, what: str) -> Any:
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 - the environment's

    try:
        return Image.open(io.BytesIO(data)).convert("RGB")
    except UnidentifiedImageError as exc:
        raise ValueError(f"the {what} is not an image (PNG, JPEG, WebP, …).") from exc
    except OSError as exc:
        raise ValueError(f"the {what} could not be read: {exc}") from exc


class Painter(Protocol):
    """What the image routes run: the diffusers pipelines, or stable-diffusion.cpp's."""

    default_size: int
    size_step: int  # widths and heights are multiples of it

    def run(self, job: Job, counters: Counters, gone: threading.Event) -> list[Any]:
        """The job's PIL images; stops at a step once ``gone`` is set, where it can."""
        ...


def make_app(pipelines: Painter, served_names: list[str]) -> web.Application:
    return engine_app(served_names, image_routes(pipelines), client_max_size=64 * 2**20)


def image_routes(pipelines: Painter) -> list[web.RouteDef]:
    """/v1/images/generations and /edits, and the image /metrics, on a painter (a plugin's
    too: deployments/engines/plugin_server.py)."""
    lock = asyncio.Lock()  # one request at a time on the device; the rest wait in order
    counters = Counters()

    async def answer(job: Job) -> web.Response:
        gone = threading.Event()
        counters.waiting += 1
        try:
            async with lock:
                counters.waiting -= 1
                counters.running += 1
                try:
                    images = await asyncio.to_thread(pipelines.run, job, counters, gone)
                except asyncio.CancelledError:
                    gone.set()  # the client left: the pipeline stops at its next step
                    counters.cancelled += 1
                    raise
                except Exception as exc:  # diffusers' and torch's own words, whatever they raise
                    log.exception("the pipeline failed")
                    return error(500, f"The pipeline failed: {exc}", "engine_error", "server_error")
                finally:
                    counters.running -= 1
        except asyncio.CancelledError:
            if not gone.is_set():
                counters.waiting -= 1  # left while waiting its turn
            raise
        counters.requests += 1
        data = []
        for image in images:
            out = io.BytesIO()
            image.save(out, format=FORMATS[job.output_format])
            encoded = base64.b64encode(out.getvalue()).decode()
            if job.response_format == "url":
                data.append({"url": f"data:image/{job.output_format};base64,{encoded}"})
            else:
                data.append({"b64_json": encoded})
        return web.json_response({"created": int(time.time()), "data": data})

    async def generations(request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        try:
            job = job_of(body, pipelines.default_size, pipelines.size_step)
        except ValueError as exc:
            return error(400, str(exc), "invalid_request")
        return await answer(job)

    async def edits(request: web.Request) -> web.Response:
        try:
            form = await request.post()
        except ValueError:
            return error(400, "The body must be multipart/form-data.", "invalid_request")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        upload = form.get("image") or form.get("image[]")
        if not isinstance(upload, web.FileField):
            return error(400, "'image' (the picture to edit) is required.", "missing_image")
        mask = form.get("mask")
        try:
            source = picture(upload.file.read(), "image")
            width, height = source.size
            step = pipelines.size_step
            default = max(64, min(2048, (min(width, height) // step) * step))
            job = job_of(fields, default, step)
            job.source = source
            if isinstance(mask, web.FileField):
                job.mask = picture(mask.file.read(), "mask").convert("L")
        except ValueError as exc:
            return error(400, str(exc), "invalid_request")
        return await answer(job)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=counters.text(), content_type="text/plain")

    return [
        web.post("/v1/images/generations", generations),
        web.post("/v1/images/edits", edits),
        web.get("/metrics", metrics),
    ]


if __name__ == "__main__":
    run_engine(
        "diffusers-engine",
        lambda model, config, names: make_app(Pipelines(model, config), names),
    )
