"""The command line of the tiny-model builders that run in an engine environment
(`make_tiny_model` calls them there): OUT and --seed, then the builder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


def tiny_main(prog: str, write: Callable[[Path, int], None]) -> None:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out.resolve(), args.seed)
