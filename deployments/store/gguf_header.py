"""A GGUF file's header, read within bounds: the scalar metadata a stored model shows and
each tensor's element count. `gguf.GGUFReader` builds every key, and every element of
every array, in memory: a crafted file of a few MB (an array of a million strings) costs
it gigabytes. Here arrays are skipped (the tokenizer's tens of thousands of strings
included) and every count is capped, so reading a header costs its bytes, once."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

MAGIC = b"GGUF"
MAX_KEYS = 4096
MAX_TENSORS = 1 << 20
MAX_STRING = 1 << 20  # a key or a string value
MAX_ARRAY = 1 << 24  # elements of one array, skipped
MAX_SKIPPED = 1 << 25  # elements of every array together
MAX_DIMS = 8
MAX_DIM = 1 << 40
SHOWN_STRING = 200  # a string value kept, at most

# GGUF value types: their sizes where fixed; 8 is a string, 9 an array.
FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class BadHeader(ValueError):
    """Not a GGUF header, or one past the bounds."""


@dataclass
class Header:
    values: dict[str, Any] = field(default_factory=dict)  # scalar metadata only
    tensor_types: list[int] = field(default_factory=list)
    parameters: int = 0


class Reader:
    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.skipped = 0

    def take(self, size: int) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            raise BadHeader("the header ends early")
        return data

    def number(self, code: str) -> Any:
        return struct.unpack("<" + code, self.take(struct.calcsize(code)))[0]

    def string(self, keep: bool = True) -> str:
        length = self.number("Q")
        if length > MAX_STRING:
            raise BadHeader(f"a string of {length} bytes")
        if not keep:
            self.stream.seek(length, 1)
            return ""
        return self.take(length).decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind in FIXED:
            return self.number(FIXED[kind])
        if kind == STRING:
            return self.string()[:SHOWN_STRING]
        if kind == ARRAY:
            self.skip_array()
            return None
        raise BadHeader(f"an unknown value type {kind}")

    def skip_array(self) -> None:
        kind, count = self.number("I"), self.number("Q")
        if count > MAX_ARRAY or self.skipped + count > MAX_SKIPPED:
            raise BadHeader(f"an array of {count} elements")
        self.skipped += count
        if kind in FIXED:
            self.stream.seek(struct.calcsize(FIXED[kind]) * count, 1)
        elif kind == STRING:
            for _ in range(count):
                self.string(keep=False)
        else:
            raise BadHeader("an array of arrays")


def read(path: Path) -> Header:
    with path.open("rb") as stream:
        reader = Reader(stream)
        if reader.take(4) != MAGIC:
            raise BadHeader("not a GGUF file")
        version = reader.number("I")
        if version < 2:
            raise BadHeader(f"GGUF version {version}")
        tensors, keys = reader.number("Q"), reader.number("Q")
        if keys > MAX_KEYS or tensors > MAX_TENSORS:
            raise BadHeader(f"{keys} keys and {tensors} tensors")
        header = Header()
        for _ in range(keys):
            key = reader.string()
            found = reader.value(reader.number("I"))
            if found is not None:
                header.values[key[:SHOWN_STRING]] = found
        for _ in range(tensors):
            reader.string(keep=False)
            dims = reader.number("I")
            if dims > MAX_DIMS:
                raise BadHeader(f"a tensor of {dims} dimensions")
            count = 1
            for _ in range(dims):
                size = reader.number("Q")
                if size > MAX_DIM:
                    raise BadHeader(f"a dimension of {size}")
                count *= size
            header.tensor_types.append(reader.number("I"))
            reader.number("Q")  # its offset in the data
            header.parameters += count
        return header
