"""What a stored model is, read from its own files: the format, the file or folder an engine
loads, and the figures its metadata states (parameters, quantization, context length, layers,
heads), from a GGUF header, `config.json` and safetensors headers. A loader and use are
suggested from the format. Reads are bounded: a model's metadata never costs its weights'
size in memory."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path  # noqa: TC003 - a dataclass field
from typing import Any

import gguf

MAX_JSON = 4 << 20  # config.json, model_index.json, a safetensors header
GGML_MAGIC = b"lmgg"  # whisper.cpp's ggml files (0x67676d6c, little-endian)
GGUF_MAGIC = b"GGUF"


@dataclass
class Described:
    format: str
    primary: Path  # what a deployment's `store:NAME` is: the file or the folder
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def loader(self) -> str | None:
        return SUGGESTED.get(self.format, (None, None))[0]

    @property
    def usecase(self) -> str | None:
        guessed = SUGGESTED.get(self.format, (None, None))[1]
        return "embed" if self.details.get("embedding_model") else guessed


SUGGESTED: dict[str, tuple[str, str]] = {
    "gguf": ("llama_server", "generate"),
    "safetensors": ("vllm", "generate"),
    "pytorch": ("vllm", "generate"),
    "diffusers": ("diffusers", "image"),
    "ggml": ("whispercpp", "transcription"),
    "ctranslate2": ("faster_whisper", "transcription"),
    "onnx-voice": ("tts", "tts"),
}


def describe(path: Path) -> Described:
    if path.is_file():
        return describe_file(path)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    names = {p.relative_to(path).as_posix() for p in files}
    if "model_index.json" in names:
        return Described("diffusers", path, {"pipeline": read_json(path / "model_index.json")})
    ggufs = [p for p in files if p.suffix == ".gguf" and "mmproj" not in p.name.lower()]
    if "config.json" in names and (weights := [p for p in files if p.suffix == ".safetensors"]):
        return Described("safetensors", path, hf_details(path, weights))
    if "config.json" in names and any(p.name.startswith("pytorch_model") for p in files):
        return Described("pytorch", path, hf_details(path, []))
    if "model.bin" in names and any(n.startswith("vocabulary") for n in names):
        return Described("ctranslate2", path, config_details(read_json(path / "config.json")))
    voices = [p for p in files if p.suffix == ".onnx" and (p.parent / (p.name + ".json")).exists()]
    if len(voices) == 1:
        return Described("onnx-voice", voices[0], voice_details(voices[0]))
    if len(ggufs) == 1:
        described = describe_file(ggufs[0])
        mmproj = [p.name for p in files if p.suffix == ".gguf" and p not in ggufs]
        if mmproj:
            described.details["mmproj"] = mmproj
        return described
    if ggufs:  # several quantizations: a deployment names one, store:NAME/FILE
        return Described("gguf", path, {"files": [p.relative_to(path).as_posix() for p in ggufs]})
    if len(files) == 1:
        return describe_file(files[0])
    return Described("unknown", path, {})


def describe_file(path: Path) -> Described:
    with path.open("rb") as f:
        magic = f.read(4)
    if magic == GGUF_MAGIC:
        return Described("gguf", path, gguf_details(path))
    if magic == GGML_MAGIC:
        return Described("ggml", path, {})
    if path.suffix == ".safetensors":
        return Described("safetensors", path, {"parameters": safetensors_parameters([path])})
    if path.suffix == ".onnx" and (path.parent / (path.name + ".json")).exists():
        return Described("onnx-voice", path, voice_details(path))
    return Described("unknown", path, {})


def gguf_details(path: Path) -> dict[str, Any]:
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, struct.error) as exc:
        return {"unreadable": f"the GGUF header cannot be read: {exc}"[:300]}

    def value(key: str) -> Any:
        found = reader.get_field(key)
        if found is None:
            return None
        try:
            return found.contents()
        except (ValueError, IndexError):
            return None

    arch = value("general.architecture") or ""
    details: dict[str, Any] = {
        "architecture": arch,
        "name": value("general.name"),
        "parameters": sum(int(t.n_elements) for t in reader.tensors),
        "quantization": quantization(value("general.file_type"), reader),
        "context_length": value(f"{arch}.context_length"),
        "layers": value(f"{arch}.block_count"),
        "embedding_length": value(f"{arch}.embedding_length"),
        "heads": value(f"{arch}.attention.head_count"),
        "kv_heads": value(f"{arch}.attention.head_count_kv"),
        "key_length": value(f"{arch}.attention.key_length"),
        "value_length": value(f"{arch}.attention.value_length"),
        "embedding_model": value(f"{arch}.pooling_type") is not None,
    }
    return {k: v for k, v in details.items() if v not in (None, "")}


def quantization(file_type: Any, reader: gguf.GGUFReader) -> str:
    """The file's stated type (LlamaFileType: MOSTLY_Q4_K_M as Q4_K_M), else its tensors'
    most common type."""
    if isinstance(file_type, int):
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    kinds: dict[str, int] = {}
    for tensor in reader.tensors:
        kinds[tensor.tensor_type.name] = kinds.get(tensor.tensor_type.name, 0) + 1
    return max(kinds, key=lambda k: kinds[k]) if kinds else ""


def read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_JSON:
            return {}
        found = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def config_details(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(text, dict)
    quant = config.get("quantization_config")
    architectures = config.get("architectures") or [""]
    details = {
        "architecture": architectures[0] if isinstance(architectures, list) else "",
        "model_type": config.get("model_type"),
        "context_length": text.get("max_position_embeddings"),
        "layers": text.get("num_hidden_layers") or text.get("encoder_layers"),
        "embedding_length": text.get("hidden_size") or text.get("d_model"),
        "heads": text.get("num_attention_heads"),
        "kv_heads": text.get("num_key_value_heads") or text.get("num_attention_heads"),
        "key_length": text.get("head_dim"),
        "dtype": config.get("torch_dtype") or config.get("dtype"),
        "quantization": quant.get("quant_method") if isinstance(quant, dict) else None,
    }
    if isinstance(details["architecture"], str) and any(
        word in details["architecture"] for word in ("Bert", "Embedding", "Roberta")
    ):
        details["embedding_model"] = True
    return {k: v for k, v in details.items() if v not in (None, "")}


def hf_details(path: Path, weights: list[Path]) -> dict[str, Any]:
    details = config_details(read_json(path / "config.json"))
    if weights:
        details["parameters"] = safetensors_parameters(weights)
    if "quantization" not in details and details.get("dtype"):
        details["quantization"] = str(details["dtype"])
    return details


def safetensors_parameters(files: list[Path]) -> int | None:
    """The tensors' element count, from each file's header (8 bytes of length, then JSON)."""
    total = 0
    for path in files:
        try:
            with path.open("rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > MAX_JSON:
                    return None
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error):
            return None
        for name, tensor in header.items():
            if name != "__metadata__" and isinstance(tensor, dict):
                total += math.prod(int(n) for n in tensor.get("shape", []))
    return total


def voice_details(path: Path) -> dict[str, Any]:
    config = read_json(path.parent / (path.name + ".json"))
    audio = config.get("audio")
    language = config.get("language")
    audio = audio if isinstance(audio, dict) else {}
    language = language if isinstance(language, dict) else {}
    details = {"sample_rate": audio.get("sample_rate"), "language": language.get("code")}
    return {k: v for k, v in details.items() if v}
