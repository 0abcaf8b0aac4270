"""A tiny llama-architecture GGUF that the project makes itself: a real model for llama.cpp
with no download of any kind.

The tokenizer is byte-level BPE (GPT-2's byte alphabet: all 256 bytes, a few merges of
common English pairs, and ChatML's control tokens); the weights are seeded random numbers,
a few layers wide enough to be a model and small enough to load in a blink (well under
10 MB). Its replies are nonsense, but printable: one residual dimension is held constant
through every layer (nothing writes to it), so after the final norm it is always positive,
and the output weights give every token that is not printable ASCII a large negative
weight on it. No end-of-generation token can be chosen either, so a reply runs to
`max_tokens`, the same at temperature 0 for the same seed. The embedding variant pools the
hidden states by their mean: one vector per input.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gguf
import numpy as np

if TYPE_CHECKING:
    from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONTROL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Common English pairs, merged in this order (each result is a token of its own).
MERGES = (
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("o", "n"),
    ("Ġ", "a"),
    ("r", "e"),
    ("Ġ", "s"),
    ("e", "n"),
    ("a", "t"),
    ("o", "r"),
    ("Ġ", "w"),
    ("Ġ", "o"),
    ("i", "s"),
    ("Ġ", "m"),
    ("e", "s"),
    ("in", "g"),
    ("Ġ", "c"),
)
CONSTANT_DIM = 0  # the residual dimension no layer writes to
SUPPRESSED = -60.0


@dataclass(frozen=True)
class Shape:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    # The context it was "trained" for: long enough that a test can hold a generation running
    # for seconds; a deployment asks for less with n_ctx.
    n_ctx: int = 32768


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character map: printable bytes stand for themselves, the rest are
    moved past 255 so that every byte is a visible character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, their types (1 normal, 3 control) and the merges."""
    tokens = byte_alphabet()
    for left, right in MERGES:
        tokens.append(left + right)
    types = [1] * len(tokens)
    tokens += CONTROL
    types += [3] * len(CONTROL)
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


def printable(token: str, alphabet: list[str]) -> bool:
    """A token made only of printable ASCII (the space included)."""
    to_byte = {c: b for b, c in enumerate(alphabet)}
    if any(c not in to_byte for c in token):
        return False
    return all(0x20 <= to_byte[c] <= 0x7E for c in token)


def write(path: Path, seed: int = 0, embedding: bool = False, shape: Shape = Shape()) -> Path:
    logging.getLogger("gguf").setLevel(logging.WARNING)  # its per-file chatter
    tokens, types, merges = vocabulary()
    alphabet = byte_alphabet()
    rng = np.random.default_rng(seed)
    n_vocab, d = len(tokens), shape.n_embd

    def weights(rows: int, cols: int, scale: float = 0.5) -> np.ndarray:
        drawn: np.ndarray = rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)
        return drawn.astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # renamed once whole
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name("modelship-tiny-embed" if embedding else "modelship-tiny")
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(d)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head)
    writer.add_rope_dimension_count(d // shape.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if embedding:
        writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    embed = weights(n_vocab, d, scale=1.0)
    embed[:, CONSTANT_DIM] = 4.0  # the constant dimension, the same for every token
    writer.add_tensor("token_embd.weight", embed)
    for i in range(shape.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(d, d))
        attn_out = weights(d, d)
        attn_out[CONSTANT_DIM, :] = 0.0  # writes nothing to the constant dimension
        writer.add_tensor(f"blk.{i}.attn_output.weight", attn_out)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(shape.n_ff, d))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(shape.n_ff, d))
        down = weights(d, shape.n_ff)
        down[CONSTANT_DIM, :] = 0.0
        writer.add_tensor(f"blk.{i}.ffn_down.weight", down)
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    output = weights(n_vocab, d, scale=4.0)
    for token_id, token in enumerate(tokens):
        allowed = types[token_id] == 1 and printable(token, alphabet)
        output[token_id, CONSTANT_DIM] = 0.0 if allowed else SUPPRESSED
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path


def write_lora(path: Path, seed: int = 1, rank: int = 4, shape: Shape = Shape()) -> Path:
    """A LoRA adapter for the tiny model (llama.cpp's GGUF adapter format): low-rank A and B
    for its output projection, strong enough that its greedy answers change, blind to the
    constant dimension so the tokens the model never writes stay suppressed."""
    logging.getLogger("gguf").setLevel(logging.WARNING)
    n_vocab = len(vocabulary()[0])
    rng = np.random.default_rng(seed)
    # ggml's shapes are numpy's reversed: A is [in, rank], B is [rank, out] to llama.cpp.
    lora_a = (rng.standard_normal((rank, shape.n_embd)) * 2.0).astype(np.float32)
    lora_a[:, CONSTANT_DIM] = 0.0
    lora_b = (rng.standard_normal((n_vocab, rank)) * 2.0).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))  # a scale of alpha / rank: 1
    writer.add_tensor("output.weight.lora_a", lora_a)
    writer.add_tensor("output.weight.lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path
