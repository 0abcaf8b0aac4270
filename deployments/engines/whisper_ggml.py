"""whisper.cpp's ggml model file: a check of its header and tensor shapes before whisper.cpp
loads it (whisper.cpp aborts the process on a tensor of the wrong size rather than failing),
and a tiny model written from seeded random weights, with no download.

The file: magic, eleven int32 hyper-parameters, the mel filter bank, the vocabulary (length-
prefixed byte strings), then tensors (dims count, name length, type, dims innermost first,
name, data), named as OpenAI's Whisper names them. Only numpy and the standard library: the
engine imports it in its own environment, `make_tiny_model` in Modelship's. The check needs the
standard library only (numpy is loaded where weights are made): the loader runs it in every
Modelship process.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np

MAGIC = 0x67676D6C
HPARAMS = (
    "n_vocab",
    "n_audio_ctx",
    "n_audio_state",
    "n_audio_head",
    "n_audio_layer",
    "n_text_ctx",
    "n_text_state",
    "n_text_head",
    "n_text_layer",
    "n_mels",
    "ftype",
)
N_FFT = 201  # whisper's 400-sample window: 201 frequency bins
TYPE_SIZES = {0: 4, 1: 2}  # f32, f16 (quantised files are left to whisper.cpp to judge)
F32_ALWAYS = frozenset(
    {
        "encoder.conv1.bias",
        "encoder.conv2.bias",
        "encoder.positional_embedding",
        "decoder.positional_embedding",
    }
)
# whisper.cpp's convolution (im2col) takes f16 kernels only: an f32 one aborts the process.
F16_ONLY = frozenset({"encoder.conv1.weight", "encoder.conv2.weight"})


@dataclass(frozen=True)
class Hparams:
    n_vocab: int = 51865  # multilingual: translation and language detection work
    n_audio_ctx: int = 1500
    n_audio_state: int = 64
    n_audio_head: int = 2
    n_audio_layer: int = 1
    n_text_ctx: int = 448
    n_text_state: int = 64
    n_text_head: int = 2
    n_text_layer: int = 1
    n_mels: int = 80
    ftype: int = 1  # f16 matrices, as whisper.cpp's converters write them


def expected_shapes(h: Hparams) -> dict[str, tuple[int, ...]]:
    """Every tensor whisper.cpp reads, with its shape (outermost first, numpy's order)."""
    a, t = h.n_audio_state, h.n_text_state
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.positional_embedding": (h.n_audio_ctx, a),
        "encoder.conv1.weight": (a, h.n_mels, 3),
        "encoder.conv1.bias": (a, 1),
        "encoder.conv2.weight": (a, a, 3),
        "encoder.conv2.bias": (a, 1),
        "encoder.ln_post.weight": (a,),
        "encoder.ln_post.bias": (a,),
        "decoder.positional_embedding": (h.n_text_ctx, t),
        "decoder.token_embedding.weight": (h.n_vocab, t),
        "decoder.ln.weight": (t,),
        "decoder.ln.bias": (t,),
    }
    for side, n, layers, attns in (
        ("encoder", a, h.n_audio_layer, ("attn",)),
        ("decoder", t, h.n_text_layer, ("attn", "cross_attn")),
    ):
        for i in range(layers):
            block = f"{side}.blocks.{i}"
            shapes |= {
                f"{block}.mlp_ln.weight": (n,),
                f"{block}.mlp_ln.bias": (n,),
                f"{block}.mlp.0.weight": (4 * n, n),
                f"{block}.mlp.0.bias": (4 * n,),
                f"{block}.mlp.2.weight": (n, 4 * n),
                f"{block}.mlp.2.bias": (n,),
            }
            for attn in attns:
                shapes |= {
                    f"{block}.{attn}_ln.weight": (n,),
                    f"{block}.{attn}_ln.bias": (n,),
                    f"{block}.{attn}.query.weight": (n, n),
                    f"{block}.{attn}.query.bias": (n,),
                    f"{block}.{attn}.key.weight": (n, n),
                    f"{block}.{attn}.value.weight": (n, n),
                    f"{block}.{attn}.value.bias": (n,),
                    f"{block}.{attn}.out.weight": (n, n),
                    f"{block}.{attn}.out.bias": (n,),
                }
    return shapes


def problems(path: str | Path) -> list[str]:
    """What is wrong with a ggml Whisper file, in words; empty when whisper.cpp can load it."""
    try:
        with open(path, "rb") as f:
            return _check(f, os.path.getsize(path))
    except OSError as exc:
        return [f"cannot read {path}: {exc.strerror}"]
    except struct.error:
        return [f"{path} ends before its header does"]


def _check(f: BinaryIO, size: int) -> list[str]:
    (magic,) = struct.unpack("<I", f.read(4))
    if magic != MAGIC:
        return ["not a ggml Whisper model (bad magic)"]
    h = Hparams(*struct.unpack("<11i", f.read(44)))
    if h.ftype not in TYPE_SIZES:
        return []  # quantised: whisper.cpp checks those itself
    n_mel, n_fft = struct.unpack("<2i", f.read(8))
    f.seek(n_mel * n_fft * 4, os.SEEK_CUR)
    (n_tokens,) = struct.unpack("<i", f.read(4))
    for _ in range(n_tokens):
        (length,) = struct.unpack("<i", f.read(4))
        f.seek(length, os.SEEK_CUR)
    wanted, found, issues = expected_shapes(h), set(), []
    while f.tell() < size:
        n_dims, name_len, kind = struct.unpack("<3i", f.read(12))
        dims = struct.unpack(f"<{n_dims}i", f.read(4 * n_dims))
        name = f.read(name_len).decode(errors="replace")
        shape = tuple(reversed(dims))
        if name not in wanted:
            issues.append(f"unexpected tensor {name!r}")
        elif shape != wanted[name]:
            issues.append(f"tensor {name} is {shape}, this model's sizes need {wanted[name]}")
        if kind not in TYPE_SIZES:
            issues.append(f"tensor {name} has an unknown type {kind}")
            break
        if name in F16_ONLY and kind != 1:
            issues.append(f"tensor {name} must be f16 (whisper.cpp's convolution needs it)")
        found.add(name)
        f.seek(math.prod(shape) * TYPE_SIZES[kind], os.SEEK_CUR)
    if f.tell() > size:
        issues.append("the file ends inside a tensor")
    issues += [f"tensor {name} is missing" for name in sorted(set(wanted) - found)]
    return issues


def mel_filters(n_mels: int, sample_rate: int = 16000) -> np.ndarray:
    """Triangular filters on the mel scale over whisper's 201 frequency bins."""
    import numpy as np  # noqa: PLC0415 - the check above needs none (module docstring)

    def mel(hz: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    bins = np.linspace(0, sample_rate / 2, N_FFT)
    edges = np.linspace(mel(np.array(0.0)), mel(np.array(sample_rate / 2)), n_mels + 2)
    hz = 700.0 * (10 ** (edges / 2595.0) - 1.0)
    filters = np.zeros((n_mels, N_FFT), dtype=np.float32)
    for i in range(n_mels):
        low, mid, high = hz[i], hz[i + 1], hz[i + 2]
        rising = (bins - low) / max(mid - low, 1e-6)
        falling = (high - bins) / max(high - mid, 1e-6)
        filters[i] = np.clip(np.minimum(rising, falling), 0.0, None)
    return filters


def vocabulary(n: int) -> list[bytes]:
    """A byte-level vocabulary of GPT-2's size (whisper.cpp adds the special tokens after
    it): every byte, then lowercase pieces of two, three and four letters, with and without a
    leading space, so that what the random model says is printable nonsense."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = [bytes([b]) for b in range(256)]
    for width in (2, 3, 4):
        for prefix in (" ", ""):
            for piece in itertools.product(letters, repeat=width):
                if len(tokens) == n:
                    return tokens
                tokens.append((prefix + "".join(piece)).encode())
    return tokens


def write_tiny(path: str | Path, seed: int = 0, hparams: Hparams | None = None) -> None:
    """A tiny multilingual Whisper (one layer a side, 64 wide, about 8 MB), seeded random
    weights, f16 matrices and f32 vectors as whisper.cpp's converters write them: it
    transcribes anything to nonsense, quickly. Written atomically."""
    import numpy as np  # noqa: PLC0415 - the check above needs none (module docstring)

    h = hparams or Hparams()
    rng = np.random.default_rng(seed)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<I", MAGIC))
        f.write(struct.pack("<11i", *(getattr(h, name) for name in HPARAMS)))
        filters = mel_filters(h.n_mels)
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        tokens = vocabulary(50257)
        f.write(struct.pack("<i", len(tokens)))
        for token in tokens:
            f.write(struct.pack("<i", len(token)) + token)
        for name, shape in expected_shapes(h).items():
            if name.endswith(("ln.weight", "ln_post.weight", "_ln.weight")):
                data = np.ones(shape, dtype="<f4")
            else:
                data = (rng.standard_normal(shape) * 0.02).astype("<f4")
            kind = 0 if len(shape) < 2 or name in F32_ALWAYS else 1
            if kind == 1:
                data = data.astype("<f2")
            encoded = name.encode()
            f.write(struct.pack("<3i", len(shape), len(encoded), kind))
            f.write(struct.pack(f"<{len(shape)}i", *reversed(shape)))
            f.write(encoded)
            f.write(data.tobytes())
    os.replace(tmp, path)
