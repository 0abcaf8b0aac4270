"""A Stable Diffusion 1.5-shaped model of seeded random weights, for stable-diffusion.cpp:
it takes no tiny model (it tells the version of a model by its tensors' shapes, and refuses
one it does not know), so this is the real architecture (a 320-wide UNet, the 4-level VAE, a
12-layer CLIP ViT-L text encoder: about 1.07 billion parameters, 2 GB in float16) with
noise for weights. It paints noise, in seconds, with no download.

The shapes come from diffusers' and transformers' own classes built on the meta device (no
memory, no torch initialisation); the weights are numpy's, written in diffusers' folder layout
(unet/, vae/, text_encoder/ safetensors), which stable-diffusion.cpp reads as it is. The text
encoder's tensors keep the `text_model.` prefix stable-diffusion.cpp looks for (transformers 5
saves CLIPTextModel without it). Runs in the diffusers engine environment (`manage.py
make_tiny_model --kind sd15-random` calls it there); written to a folder beside OUT, then
renamed.

Run: ``python -m deployments.engines.sd15_random OUT [--seed N]``
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from safetensors.numpy import save_file
from transformers import CLIPTextConfig, CLIPTextModel

from deployments.engines.tiny_main import folder_beside, tiny_main

if TYPE_CHECKING:
    from pathlib import Path

UNET = {
    "sample_size": 64,
    "cross_attention_dim": 768,
    "attention_head_dim": 8,
    "block_out_channels": (320, 640, 1280, 1280),
    "layers_per_block": 2,
}
VAE = {
    "block_out_channels": (128, 256, 512, 512),
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "latent_channels": 4,
    "layers_per_block": 2,
    "sample_size": 512,
}
CLIP = CLIPTextConfig(
    vocab_size=49408,
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    max_position_embeddings=77,
    hidden_act="quick_gelu",
)


def shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}


def weights(named: dict[str, tuple[int, ...]], rng: np.random.Generator) -> dict[str, Any]:
    """Noise for matrices and convolutions; ones for norms' scales; zeros for biases."""
    out: dict[str, Any] = {}
    for name, shape in named.items():
        if "norm" in name and name.endswith("weight"):
            out[name] = np.ones(shape, dtype=np.float16)
        elif name.endswith("bias"):
            out[name] = np.zeros(shape, dtype=np.float16)
        elif "position_ids" in name:
            out[name] = np.arange(shape[-1], dtype=np.int64).reshape(shape)
        else:
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
    return out


def write(out: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with torch.device("meta"):
        parts = {
            "unet/diffusion_pytorch_model.safetensors": shapes(UNet2DConditionModel(**UNET)),
            "vae/diffusion_pytorch_model.safetensors": shapes(AutoencoderKL(**VAE)),
            "text_encoder/model.safetensors": {
                (name if name.startswith("text_model.") else f"text_model.{name}"): shape
                for name, shape in shapes(CLIPTextModel(CLIP)).items()
            },
        }
    with folder_beside(out) as building:
        for relative, named in parts.items():
            target = building / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            save_file(weights(named, rng), str(target))


if __name__ == "__main__":
    tiny_main("sd15-random", write)
