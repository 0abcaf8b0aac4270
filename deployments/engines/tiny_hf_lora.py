"""A tiny LoRA adapter for the tiny Hugging Face Llama (tiny_hf_llama.py), in PEFT's format:
adapter_config.json and adapter_model.safetensors, rank 8 on every layer's attention output
and MLP down projections, seeded values strong enough that vLLM's greedy answers change
with it. Runs in the vLLM engine environment (`manage.py make_tiny_model --kind hf-lora`).

Run: ``python -m deployments.engines.tiny_hf_lora OUT [--seed N]``
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from deployments.engines.tiny_main import folder_beside, tiny_main

if TYPE_CHECKING:
    from pathlib import Path

RANK = 8
WIDTH, FFN, LAYERS = 64, 128, 2  # tiny_hf_llama's
TARGETS = {"self_attn.o_proj": (WIDTH, WIDTH), "mlp.down_proj": (FFN, WIDTH)}


def write(out: Path, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for module, (inputs, outputs) in TARGETS.items():
            name = f"base_model.model.model.layers.{layer}.{module}"
            a = torch.randn(RANK, inputs, generator=generator) * 2.0
            b = torch.randn(outputs, RANK, generator=generator) * 2.0
            tensors[f"{name}.lora_A.weight"] = a.contiguous()
            tensors[f"{name}.lora_B.weight"] = b.contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted(m.split(".")[-1] for m in TARGETS),
        "base_model_name_or_path": "modelship-tiny-hf-llama",
    }
    with folder_beside(out) as building:
        save_file(tensors, str(building / "adapter_model.safetensors"))
        (building / "adapter_config.json").write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    tiny_main("tiny-hf-lora", write)
