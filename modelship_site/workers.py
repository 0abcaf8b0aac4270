"""How many server processes `serve` runs: `--workers N`, or `auto` (MSHIP_SERVE_WORKERS).

`auto` is one per core this process may run on, where there are more than two: on two
cores a second worker competes with the engines, the cluster and the load it serves for
the same cores (bench/results.md measures one against two); past AUTO_CAP, each more
worker mostly adds memory (a worker holds its own route table and engine connections,
some 100 MB) to a gateway whose engines are the bottleneck.
"""

from __future__ import annotations

import os

AUTO_CAP = 16


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_count(asked: str, server: str, cores: int | None = None) -> int:
    """The number of workers `asked` means (a positive number, or `auto`); ValueError with
    the reason for anything else. More than one runs under uvicorn only: `auto` under
    daphne is one."""
    if asked.strip().lower() == "auto":
        found = usable_cores() if cores is None else cores
        if server != "uvicorn" or found <= 2:
            return 1
        return min(found, AUTO_CAP)
    try:
        count = int(asked)
    except ValueError:
        raise ValueError(f"--workers takes a number or 'auto', not {asked!r}") from None
    if count < 1:
        raise ValueError("--workers takes 1 or more")
    if count > 1 and server != "uvicorn":
        raise ValueError("more than 1 worker runs with uvicorn only")
    return count
