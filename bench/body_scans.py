"""Benchmark: what the worst body costs the gateway's readers (openai_api/bodies.py), with no
server: the JSON depth scan on a string of escaped quotes that never ends, and a multipart
`model` part in punycode. Each is timed once per size, as a caller would send it.

`--old` also times the depth scan as it was before issue 35 (a pattern retried from every
quote of an unterminated string: quadratic), at the sizes it finishes in reasonable time.

    .venv/bin/python bench/body_scans.py [--old]
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openai_api.bodies import form_field, too_deep
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from collections.abc import Callable

FORM = "multipart/form-data; boundary=b"
OLD_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def old_too_deep(body: bytes, limit: int = 64) -> bool:
    """The scan before issue 35, kept here only to measure against."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    for match in OLD_TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def escaped_quotes(size: int) -> bytes:
    head = b'{"model": "sim", "x": [' + b"[], " * 65 + b'[]], "y": "'
    return head + b'\\"' * ((size - len(head)) // 2)


def punycode_form(size: int) -> bytes:
    head = b'--b\r\nContent-Disposition: form-data; name="model"\r\n'
    head += b"Content-Type: text/plain; charset=punycode\r\n\r\nsim-"
    return head + b"a" * (size - len(head)) + b"\r\n--b--\r\n"


def timed(what: str, size: int, call: Callable[[], object]) -> None:
    began = time.perf_counter()
    try:
        call()
        outcome = "done"
    except GatewayError as exc:
        outcome = f"{exc.status} {exc.code}"
    elapsed_ms = 1000 * (time.perf_counter() - began)
    print(f"  {what:30} {size / 1024:>8.0f} KiB {elapsed_ms:>9.1f} ms  {outcome}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", action="store_true", help="time the quadratic scan too")
    parser.add_argument("--smoke", action="store_true", help="small sizes only")
    args = parser.parse_args()
    sizes = [32 * 1024] if args.smoke else [32 * 1024, 256 * 1024, 16 * 2**20]
    print("The worst bodies, read once each:")
    for size in sizes:
        body = escaped_quotes(size)
        timed("depth scan, escaped quotes", size, functools.partial(too_deep, body))
    for size in [200_000] if args.smoke else [200_000, 1_600_000, 16 * 2**20]:
        body = punycode_form(size)
        timed("form field, punycode", size, functools.partial(form_field, FORM, body, "model"))
    if args.old:
        for size in [8 * 1024, 16 * 1024, 32 * 1024]:
            body = escaped_quotes(size)
            timed("depth scan before issue 35", size, functools.partial(old_too_deep, body))


if __name__ == "__main__":
    main()
