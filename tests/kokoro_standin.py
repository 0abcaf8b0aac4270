"""A stand-in for a Kokoro ONNX model, for the kokoro backend's tests: no real Kokoro can be
made here (its weights are a download, and a random one would need the kokoro package and
torch to export), so this is a small ONNX graph with Kokoro's interface, run by the real
kokoro-onnx and ONNX Runtime: phoneme ids ([1, n] int64, "input_ids"), a style row ([1, 256]
float32, from the voices file) and a speed ([1] float32) in; 24 kHz audio out, a tone of
0.05 s per phoneme, shorter when faster, pitched by the style (so voices differ). The voices
file is a numpy .npz of named [510, 1, 256] style tables, as Kokoro's voices-v1.0.bin is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper

if TYPE_CHECKING:
    from pathlib import Path

SAMPLE_RATE = 24000
PER_PHONEME = 1200  # samples: 0.05 s
STYLE_WIDTH = 256
VOICES = {"af_heart": 0.0, "af_alloy": 0.5, "am_adam": -0.4}  # style level: the pitch


def constant(name: str, value: float | int, kind: int) -> onnx.NodeProto:
    tensor = helper.make_tensor(name + "_value", kind, [], [value])
    return helper.make_node("Constant", [], [name], value=tensor)


def write_model(path: Path) -> None:
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        constant("one", 1, i64),
        helper.make_node("Gather", ["shape", "one"], ["n"], axis=0),
        helper.make_node("Cast", ["n"], ["n_float"], to=f),
        constant("per_phoneme", float(PER_PHONEME), f),
        helper.make_node("Mul", ["n_float", "per_phoneme"], ["slow_length"]),
        helper.make_node("ReduceMax", ["speed"], ["speed_scalar"], keepdims=0),
        helper.make_node("Div", ["slow_length", "speed_scalar"], ["length_float"]),
        helper.make_node("Cast", ["length_float"], ["length"], to=i64),
        constant("zero", 0, i64),
        helper.make_node("Range", ["zero", "length", "one"], ["ticks"]),
        helper.make_node("Cast", ["ticks"], ["t"], to=f),
        helper.make_node("ReduceMean", ["style"], ["level"], keepdims=0),
        constant("base_hz", 220.0, f),
        constant("spread_hz", 200.0, f),
        helper.make_node("Mul", ["level", "spread_hz"], ["shift_hz"]),
        helper.make_node("Add", ["base_hz", "shift_hz"], ["hz"]),
        constant("radians", 2 * np.pi / SAMPLE_RATE, f),
        helper.make_node("Mul", ["hz", "radians"], ["step"]),
        helper.make_node("Mul", ["t", "step"], ["phase"]),
        helper.make_node("Sin", ["phase"], ["wave"]),
        constant("loudness", 0.4, f),
        helper.make_node("Mul", ["wave", "loudness"], ["waveform"]),
    ]
    graph = helper.make_graph(
        nodes,
        "kokoro-standin",
        [
            helper.make_tensor_value_info("input_ids", i64, [1, "phonemes"]),
            helper.make_tensor_value_info("style", f, [1, STYLE_WIDTH]),
            helper.make_tensor_value_info("speed", f, [1]),
        ],
        [helper.make_tensor_value_info("waveform", f, ["samples"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ONNX Runtime of any recent release reads
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_voices(path: Path) -> None:
    tables = {
        name: np.full((510, 1, STYLE_WIDTH), level, dtype=np.float32)
        for name, level in VOICES.items()
    }
    with open(path, "wb") as out:
        np.savez(out, **tables)  # type: ignore[arg-type]
