"""Whisper's multilingual vocabulary for the tiny Whisper models (CTranslate2's for
faster-whisper, Hugging Face's for vLLM): a byte-level text part, then Whisper's special,
language, task and timestamp tokens at their own ids, and a byte-level tokenizer.json of it.
Needs only `tokenizers`, so each builder's engine environment can import it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from deployments.engines.whisper_ggml import vocabulary

if TYPE_CHECKING:
    from pathlib import Path

VOCAB = 51866
# Whisper's own order: a language's token id is its place here.
_ORDER = """
en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur
hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si
km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha
ba jw su yue
"""
LANGUAGES = tuple(_ORDER.split())
TASK_TOKENS = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>")
QUIET_TOKENS = ("<|nospeech|>", "<|notimestamps|>")


def byte_level(piece: bytes) -> str:
    """GPT-2's printable stand-in for each byte, as byte-level BPE tokens are written."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    shifted = iter(range(256, 512))
    table.update({b: chr(next(shifted)) for b in range(256) if b not in table})
    return "".join(table[b] for b in piece)


def tokens() -> list[str]:
    """Whisper's multilingual layout: 50,257 byte-level pieces, end of text, start of
    transcript, a token per language, the task tokens, then 0.02 s timestamps to the end."""
    # CTranslate2 takes a Whisper whose vocabulary holds the empty token (as OpenAI's
    # multilingual ones do) for a multilingual one: it is the last text token here.
    text = [byte_level(piece) for piece in vocabulary(50256)] + [""]
    special = ["<|endoftext|>", "<|startoftranscript|>"]
    special += [f"<|{code}|>" for code in LANGUAGES]
    special += [*TASK_TOKENS, *QUIET_TOKENS]
    words = text + special
    words += [f"<|{i * 0.02:.2f}|>" for i in range(VOCAB - len(words))]
    return words


def write_tokenizer(words: list[str], path: Path) -> None:
    bpe = models.BPE(vocab={word: i for i, word in enumerate(words)}, merges=[])
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    first_special = words.index("<|endoftext|>")
    tokenizer.add_special_tokens(words[first_special:])
    tokenizer.save(str(path))
