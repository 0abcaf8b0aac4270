"""A tiny multilingual Whisper in CTranslate2's format, for faster-whisper: one layer a side,
64 wide, seeded random weights, the full 51,865-token vocabulary with Whisper's special,
language and timestamp tokens, a byte-level tokenizer.json beside it (faster-whisper would
fetch OpenAI's from the Hub without one) and the 80-bin preprocessor_config.json. It
transcribes anything to nonsense, quickly. No torch and no download: the weights are numpy
arrays set on CTranslate2's own WhisperSpec, so this runs in the faster-whisper engine
environment (`manage.py make_tiny_model --kind whisper-ct2` calls it there). Written to a
folder beside OUT, then renamed.

Run: ``python -m deployments.engines.tiny_whisper_ct2 OUT [--seed N]``
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
from ctranslate2.specs import WhisperSpec

from deployments.engines.tiny_main import folder_beside, tiny_main
from deployments.engines.whisper_vocab import LANGUAGES, VOCAB, tokens, write_tokenizer

if TYPE_CHECKING:
    from pathlib import Path

WIDTH, HEADS, LAYERS, MELS = 64, 2, 1, 80
AUDIO_CTX, TEXT_CTX = 1500, 448


def build_spec(seed: int, words: list[str]) -> WhisperSpec:
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def norm(layer: Any) -> None:
        layer.gamma = np.ones(WIDTH, dtype=np.float32)
        layer.beta = np.zeros(WIDTH, dtype=np.float32)

    def linear(layer: Any, rows: int, cols: int = WIDTH) -> None:
        layer.weight, layer.bias = rand(rows, cols), rand(rows)

    def attention(block: Any, fused: list[int]) -> None:
        norm(block.layer_norm)
        for part, rows in zip(block.linear, fused, strict=True):
            linear(part, rows)

    def feed_forward(block: Any) -> None:
        norm(block.layer_norm)
        linear(block.linear_0, 4 * WIDTH)
        linear(block.linear_1, WIDTH, 4 * WIDTH)

    spec = WhisperSpec(LAYERS, HEADS, LAYERS, HEADS)
    encoder, decoder = spec.encoder, spec.decoder
    encoder.conv1.weight, encoder.conv1.bias = rand(WIDTH, MELS, 3), rand(WIDTH)
    encoder.conv2.weight, encoder.conv2.bias = rand(WIDTH, WIDTH, 3), rand(WIDTH)
    encoder.position_encodings.encodings = rand(AUDIO_CTX, WIDTH)
    norm(encoder.layer_norm)
    for layer in encoder.layer:
        attention(layer.self_attention, [3 * WIDTH, WIDTH])
        feed_forward(layer.ffn)
    decoder.embeddings.weight = rand(VOCAB, WIDTH)
    decoder.position_encodings.encodings = rand(TEXT_CTX, WIDTH)
    norm(decoder.layer_norm)
    decoder.projection.weight = decoder.embeddings.weight
    for layer in decoder.layer:
        attention(layer.self_attention, [3 * WIDTH, WIDTH])
        attention(layer.attention, [WIDTH, 2 * WIDTH, WIDTH])
        feed_forward(layer.ffn)
    spec.register_vocabulary(words)
    languages = [words.index(f"<|{code}|>") for code in LANGUAGES]
    spec.config.suppress_ids = []
    spec.config.suppress_ids_begin = [words.index("<|endoftext|>")]
    spec.config.lang_ids = languages
    spec.config.alignment_heads = [(0, head) for head in range(HEADS)]
    return spec


def write_tiny(out: Path, seed: int = 0) -> None:
    words = tokens()
    spec = build_spec(seed, words)
    spec.validate()
    spec.optimize(quantization="float16")  # as converters are usually run: half the size
    with folder_beside(out) as building:
        spec.save(str(building))
        write_tokenizer(words, building / "tokenizer.json")
        features = {
            "feature_size": MELS,
            "sampling_rate": 16000,
            "hop_length": 160,
            "n_fft": 400,
        }
        (building / "preprocessor_config.json").write_text(json.dumps(features))


if __name__ == "__main__":
    tiny_main("tiny-whisper-ct2", write_tiny)
