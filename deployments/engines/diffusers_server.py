"""Image generation with Hugging Face diffusers at OpenAI's /v1/images/generations.

Needs the optional extra (``pip install 'modelship[diffusers]'``) and a model the host
already has (a local folder, or an id in the Hugging Face cache: nothing is downloaded when
``HF_HUB_OFFLINE=1``). The pipeline loads before the port opens, so the engine is healthy
only once it can generate.

Run: ``python -m deployments.engines.diffusers_server --model /models/sd-turbo``
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from typing import Any

from aiohttp import web

from deployments.engines.common import (
    engine_app,
    error,
    json_body,
    run_engine,
)

MAX_IMAGES = 4


def load_pipeline(model: str, config: dict[str, Any]) -> Any:
    import torch  # noqa: PLC0415 - heavy, and only in the diffusers engine's environment
    from diffusers import AutoPipelineForText2Image  # noqa: PLC0415 - as torch

    dtype = getattr(torch, str(config.get("torch_dtype", "float16")))
    device = config.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    pipeline = AutoPipelineForText2Image.from_pretrained(model, torch_dtype=dtype)
    return pipeline.to(device)


def parse_size(size: str) -> tuple[int, int]:
    width, _, height = size.partition("x")
    w, h = int(width), int(height)
    if not (64 <= w <= 4096 and 64 <= h <= 4096) or w % 8 or h % 8:
        raise ValueError
    return w, h


def make_app(pipeline: Any, served_names: list[str], config: dict[str, Any]) -> web.Application:
    lock = asyncio.Lock()  # one generation at a time on the device

    async def generations(request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return error(400, "'prompt' must be a non-empty string.", "invalid_prompt")
        if body.get("response_format", "b64_json") != "b64_json":
            return error(400, "Only response_format 'b64_json' is served.", "unsupported_format")
        n = body.get("n", 1)
        if not isinstance(n, int) or not 1 <= n <= MAX_IMAGES:
            return error(400, f"'n' must be from 1 to {MAX_IMAGES}.", "invalid_n")
        try:
            width, height = parse_size(str(body.get("size", "512x512")))
        except ValueError:
            return error(400, "'size' must be WIDTHxHEIGHT, multiples of 8.", "invalid_size")
        options = {
            "num_inference_steps": int(config.get("num_inference_steps", 4)),
            "guidance_scale": float(config.get("guidance_scale", 0.0)),
        }

        def generate() -> list[Any]:
            result = pipeline(
                prompt, num_images_per_prompt=n, width=width, height=height, **options
            )
            return list(result.images)

        async with lock:
            images = await asyncio.to_thread(generate)
        data = []
        for image in images:
            out = io.BytesIO()
            image.save(out, format="PNG")
            data.append({"b64_json": base64.b64encode(out.getvalue()).decode()})
        return web.json_response({"created": int(time.time()), "data": data})

    return engine_app(served_names, [web.post("/v1/images/generations", generations)])


if __name__ == "__main__":
    run_engine(
        "diffusers-engine",
        lambda model, config, names: make_app(load_pipeline(model, config), names, config),
    )
