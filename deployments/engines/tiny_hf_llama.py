"""A tiny Llama in Hugging Face's format, for vLLM: two layers, 64 wide, seeded random
weights (safetensors), and a byte-level BPE tokenizer of 300 tokens trained here on a few
sentences (and <think>, </think> whole), with a chat template: about 0.5 MB, no download.
Its replies are nonsense, the same for a seed; vLLM's structured output still makes them
valid JSON where asked. Runs in the vLLM engine environment (`manage.py make_tiny_model
--kind hf-llama` calls it there), written to a folder beside OUT, then renamed.

Run: ``python -m deployments.engines.tiny_hf_llama OUT [--seed N]``
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from deployments.engines.tiny_main import folder_beside, tiny_main

if TYPE_CHECKING:
    from pathlib import Path

VOCAB = 300
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# Whole tokens for vLLM's reasoning parsers (deepseek_r1 looks them up), kept in the text.
THINK = ["<think>", "</think>"]
CORPUS = [
    "Modelship serves models behind one OpenAI API.",
    "The quick brown fox jumps over the lazy dog.",
    "Tiny models answer quickly; their words mean nothing.",
    '{"name": "Ada", "age": 36, "tags": ["math", "engines"]}',
    "What is the weather in Paris? It is sunny and 21 degrees.",
]
# A Llama-3-like template, as vLLM's chat endpoint renders it.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 20, trainer=trainer)
    bpe.add_tokens([AddedToken(token, special=False) for token in THINK])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        chat_template=TEMPLATE,
        model_max_length=512,
    )


def write(out: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    words = tokenizer()
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=len(words),
        # Room for a generation long enough that a hang-up reaches vLLM before it ends.
        max_position_embeddings=16384,
        bos_token_id=words.bos_token_id,
        eos_token_id=words.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with folder_beside(out) as building:
        model.save_pretrained(str(building), safe_serialization=True)
        words.save_pretrained(str(building))


if __name__ == "__main__":
    tiny_main("tiny-hf-llama", write)
