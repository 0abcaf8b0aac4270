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

from deployments.store import gguf_header

MAX_JSON = 4 << 20  # config.json, model_index.json, a safetensors header
MAX_ITEMS = 64  # of a list or mapping kept in details
MAX_DIM = 1 << 40  # a tensor dimension a header may state
MAX_TENSORS = 1 << 20
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
    """The model at `path`, its details bounded (they are stored and shown)."""
    found = describe_unbounded(path)
    found.details = bounded(found.details) or {}
    return found


def describe_unbounded(path: Path) -> Described:
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
        parameters = safetensors_parameters([path])
        return Described(
            "safetensors", path, {} if parameters is None else {"parameters": parameters}
        )
    if path.suffix == ".onnx" and (path.parent / (path.name + ".json")).exists():
        return Described("onnx-voice", path, voice_details(path))
    return Described("unknown", path, {})


def gguf_details(path: Path) -> dict[str, Any]:
    try:
        header = gguf_header.read(path)
    except (gguf_header.BadHeader, OSError) as exc:
        return {"unreadable": f"the GGUF header cannot be read: {exc}"[:300]}
    values = header.values
    arch = str(values.get("general.architecture") or "")
    details: dict[str, Any] = {
        "architecture": arch,
        "name": values.get("general.name"),
        "type": values.get("general.type"),  # "adapter" for a LoRA
        "parameters": header.parameters,
        "quantization": quantization(values.get("general.file_type"), header.tensor_types),
        "context_length": values.get(f"{arch}.context_length"),
        "layers": values.get(f"{arch}.block_count"),
        "embedding_length": values.get(f"{arch}.embedding_length"),
        "heads": values.get(f"{arch}.attention.head_count"),
        "kv_heads": values.get(f"{arch}.attention.head_count_kv"),
        "key_length": values.get(f"{arch}.attention.key_length"),
        "value_length": values.get(f"{arch}.attention.value_length"),
    }
    if f"{arch}.pooling_type" in values:
        details["embedding_model"] = True
    return {k: v for k, v in details.items() if v not in (None, "")}


def quantization(file_type: Any, tensor_types: list[int]) -> str:
    """The file's stated type (LlamaFileType: MOSTLY_Q4_K_M as Q4_K_M), else its tensors'
    most common type."""
    import gguf  # noqa: PLC0415 - numpy with it: not in every Modelship process

    if isinstance(file_type, int):
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    kinds: dict[int, int] = {}
    for kind in tensor_types:
        kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        return ""
    common = max(kinds, key=lambda k: kinds[k])
    try:
        return gguf.GGMLQuantizationType(common).name
    except ValueError:
        return f"type {common}"


def no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON stores")


def read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_JSON:
            return {}
        found = json.loads(path.read_bytes(), parse_constant=no_constant)
    except (OSError, ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def bounded(value: Any, depth: int = 0) -> Any:
    """A value as details keep it: short strings, numbers JSON stores (finite, within 64
    bits), small lists and mappings, two levels deep; anything else dropped (None)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -(2**63) < value < 2**63 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:200]
    if depth >= 2:
        return None
    if isinstance(value, list):
        return [bounded(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        items = list(value.items())[:MAX_ITEMS]
        return {str(k)[:100]: bounded(v, depth + 1) for k, v in items}
    return None


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
    if weights and (parameters := safetensors_parameters(weights)) is not None:
        details["parameters"] = parameters
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
                header = json.loads(f.read(length), parse_constant=no_constant)
        except (OSError, ValueError, struct.error, RecursionError):
            return None
        if not isinstance(header, dict) or len(header) > MAX_TENSORS:
            return None
        for name, tensor in header.items():
            if name == "__metadata__" or not isinstance(tensor, dict):
                continue
            shape = tensor.get("shape")
            if not isinstance(shape, list) or len(shape) > 8:
                return None
            if not all(isinstance(n, int) and 0 <= n < MAX_DIM for n in shape):
                return None
            total += math.prod(shape)
    return total


def voice_details(path: Path) -> dict[str, Any]:
    config = read_json(path.parent / (path.name + ".json"))
    audio = config.get("audio")
    language = config.get("language")
    audio = audio if isinstance(audio, dict) else {}
    language = language if isinstance(language, dict) else {}
    details = {"sample_rate": audio.get("sample_rate"), "language": language.get("code")}
    return {k: v for k, v in details.items() if v}
