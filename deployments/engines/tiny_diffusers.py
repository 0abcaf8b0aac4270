"""A tiny Stable Diffusion pipeline of seeded random weights, written as a diffusers folder
with no download: a two-level UNet (32 and 64 channels, one layer each, cross-attention 32
wide), a matching VAE, a two-layer CLIP text encoder 32 wide, a byte-level CLIP tokenizer
written here, a DDIM scheduler, no safety checker. About 7 MB; it makes 64x64 images of
noise, quickly. Runs in the diffusers engine environment (`make_tiny_model --kind image`
calls it there).

Run: ``python -m deployments.engines.tiny_diffusers OUT_DIR [--seed N]``
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING

from deployments.engines.tiny_main import tiny_main

if TYPE_CHECKING:
    from pathlib import Path

SPECIAL = ("<|startoftext|>", "<|endoftext|>")


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (CLIP's tokenizer reads them)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_tokenizer(folder: Path) -> dict[str, int]:
    letters = byte_alphabet()
    tokens = [*letters, *(f"{c}</w>" for c in letters), *SPECIAL]
    vocab = {token: index for index, token in enumerate(tokens)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return vocab


def build(out: Path, seed: int) -> None:
    import torch  # noqa: PLC0415 - the diffusers environment's
    from diffusers import (  # noqa: PLC0415 - as torch
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer  # noqa: PLC0415

    torch.manual_seed(seed)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    vocab = write_tokenizer(tmp / "tokenizer-source")
    tokenizer = CLIPTokenizer(
        str(tmp / "tokenizer-source" / "vocab.json"),
        str(tmp / "tokenizer-source" / "merges.txt"),
        model_max_length=77,
    )
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=vocab[SPECIAL[0]],
            eos_token_id=vocab[SPECIAL[1]],
            pad_token_id=vocab[SPECIAL[1]],
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(vocab),
            max_position_embeddings=77,
        )
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipeline = StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(str(tmp / "pipeline"))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp / "pipeline", out)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    tiny_main("tiny-diffusers", build)
