"""Images with stable-diffusion.cpp (its Python binding, `stable-diffusion-cpp-python`, in the
sdcpp engine environment) at OpenAI's /v1/images/generations and /v1/images/edits: the same
routes, checks, queue and /metrics as the diffusers engine (deployments/engines/
diffusers_server.py), on GGML instead of torch.

The model is what stable-diffusion.cpp takes: a checkpoint file (safetensors, ckpt, GGUF) or
a diffusers folder; stable-diffusion.cpp tells its version from its tensors and refuses one
it does not know, in its own words (the start fails with them). Options
(stable_diffusion_cpp_config): threads, sample_steps (20), cfg_scale (7), sample_method,
wtype (the weights' type in memory: f16, q8_0, …), diffusion_model and vae (separate files).
Sizes are multiples of 64 (stable-diffusion.cpp would round others up).
stable-diffusion.cpp cannot stop an image half made: a client that leaves while its image is
being made lets it finish, unseen; one that leaves while it waits is dropped from the queue.

Run: ``python -m deployments.engines.sdcpp_server --model var/models/sd15-random``
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from deployments.engines.common import run_engine
from deployments.engines.diffusers_server import make_app

if TYPE_CHECKING:
    import threading

    from aiohttp import web

    from deployments.engines.diffusers_server import Counters, Job

SEEDS = 2**31 - 1


class SdCpp:
    """A stable-diffusion.cpp context: text to image, image to image, inpainting."""

    def __init__(self, model: str, config: dict[str, Any]) -> None:
        from stable_diffusion_cpp import StableDiffusion  # noqa: PLC0415 - the environment's

        options: dict[str, Any] = {"n_threads": int(config.get("threads") or -1)}
        if config.get("diffusion_model"):
            options["diffusion_model_path"] = str(config["diffusion_model"])
        else:
            options["model_path"] = model
        if config.get("vae"):
            options["vae_path"] = str(config["vae"])
        if config.get("wtype"):
            options["wtype"] = str(config["wtype"])
        try:
            self.sd = StableDiffusion(**options, verbose=True)  # its log is the engine's log
        except (RuntimeError, ValueError) as exc:  # its words are in the log just above
            raise SystemExit(f"stable-diffusion.cpp: {model} cannot be loaded: {exc}") from exc
        if not self.sd.model:  # a refusal is a null context, its reason in the log above
            raise SystemExit(f"stable-diffusion.cpp: {model} cannot be loaded (its log says why)")
        self.default_size = 512
        self.size_step = 64  # stable-diffusion.cpp rounds other sizes up to it
        self.steps = int(config.get("sample_steps") or 20)
        self.cfg_scale = float(config.get("cfg_scale", 7.0))
        self.sample_method = str(config.get("sample_method") or "default")

    def run(self, job: Job, counters: Counters, gone: threading.Event) -> list[Any]:
        def on_step(step: int, steps: int, seconds: float) -> None:
            counters.steps += 1

        options: dict[str, Any] = {
            "prompt": job.prompt,
            "width": job.width,
            "height": job.height,
            "batch_count": job.n,
            "sample_steps": self.steps,
            "cfg_scale": self.cfg_scale,
            "sample_method": self.sample_method,
            "seed": random.randrange(SEEDS) if job.seed is None else job.seed,
            "progress_callback": on_step,
        }
        if job.source is not None:
            size = (job.width, job.height)
            options["init_image"] = job.source.resize(size)
            options["strength"] = 1.0  # every step, as a text-to-image would
            if job.mask is not None:
                options["mask_image"] = job.mask.resize(size)
        images = self.sd.generate_image(**options)
        if not images:
            raise RuntimeError("stable-diffusion.cpp made no image (its log says why)")
        return [image.convert("RGB") for image in images]  # it answers RGBA; JPEG takes RGB


def build(model: str, config: dict[str, Any], names: list[str]) -> web.Application:
    return make_app(SdCpp(model, config), names)


if __name__ == "__main__":
    run_engine("sdcpp-engine", build)
