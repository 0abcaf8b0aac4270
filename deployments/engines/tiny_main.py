"""What the tiny-model builders that run in an engine environment share (`make_tiny_model`
calls them there): their command line (OUT and --seed), and the folder they build in."""

from __future__ import annotations

import argparse
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


def tiny_main(prog: str, write: Callable[[Path, int], None]) -> None:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out.resolve(), args.seed)


@contextmanager
def folder_beside(out: Path) -> Iterator[Path]:
    """A fresh folder beside OUT to build a model in; it replaces OUT when the block ends,
    so a reader never finds half a model there (a failed build leaves nothing)."""
    building = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        yield building
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    os.replace(building, out)
