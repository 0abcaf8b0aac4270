"""A tiny multilingual Whisper in Hugging Face's format, for vLLM's transcription and
translation: one layer a side, 64 wide, seeded random weights (safetensors), Whisper's full
vocabulary (deployments/engines/whisper_vocab.py) as a fast tokenizer, and the 80-bin
feature extractor, saved as a WhisperProcessor. It transcribes anything to nonsense. Runs
in the vLLM engine environment (`manage.py make_tiny_model --kind hf-whisper` calls it
there), written to a folder beside OUT, then renamed.

Run: ``python -m deployments.engines.tiny_hf_whisper OUT [--seed N]``
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import (
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizerFast,
)

from deployments.engines.tiny_main import folder_beside, tiny_main
from deployments.engines.whisper_vocab import tokens, write_tokenizer

if TYPE_CHECKING:
    from pathlib import Path

WIDTH, HEADS, LAYERS, MELS = 64, 2, 1, 80
END = "<|endoftext|>"


def write(out: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    words = tokens()
    config = WhisperConfig(
        vocab_size=len(words),
        num_mel_bins=MELS,
        d_model=WIDTH,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=4 * WIDTH,
        decoder_ffn_dim=4 * WIDTH,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=words.index("<|startoftranscript|>"),
        pad_token_id=words.index(END),
        bos_token_id=words.index(END),
        eos_token_id=words.index(END),
    )
    model = WhisperForConditionalGeneration(config)
    with folder_beside(out) as building:
        write_tokenizer(words, building / "tokenizer.json")
        words_fast = WhisperTokenizerFast(
            tokenizer_file=str(building / "tokenizer.json"),
            bos_token=END,
            eos_token=END,
            unk_token=END,
            pad_token=END,
        )
        processor = WhisperProcessor(
            feature_extractor=WhisperFeatureExtractor(feature_size=MELS), tokenizer=words_fast
        )
        processor.save_pretrained(str(building))
        model.save_pretrained(str(building), safe_serialization=True)


if __name__ == "__main__":
    tiny_main("tiny-hf-whisper", write)
