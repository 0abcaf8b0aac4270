"""Benchmark: the route table's check ("did the deployments, keys or teams change?", twice
a second in every gateway process) on the connection its thread keeps, against a new
connection for each check (the gateway before common/db_thread.py).

A fresh database is migrated (SQLite in a temporary folder; with --postgres, a database made
on that server and dropped after), then this process runs the catalog's own check, `stamps()`,
in both ways, taking turns for --rounds rounds of --checks checks. For each way: the wall
time and this process's CPU per check, the whole machine's CPU per check (/proc/stat: a
PostgreSQL backend forked and authenticated for each new connection is the server's CPU, not
this process's), and the connections opened.

    .venv/bin/python bench/route_table_checks.py [--checks 300] [--rounds 3]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import site_db  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine so far (every core; /proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def postgres_database(server: str) -> tuple[str, str]:
    """A database of its own on `server`: (its URL, its name)."""
    name = f"mship_bench_checks_{os.getpid()}"
    subprocess.run(["psql", server, "-qc", f"CREATE DATABASE {name}"], check=True)
    return urlunsplit(urlsplit(server)._replace(path="/" + name)), name


async def measure(way: str, checks: int, opened: list[Any]) -> dict[str, float]:
    from django.db import connection  # noqa: PLC0415 - after django.setup()

    from common.db_thread import DatabaseThread  # noqa: PLC0415
    from openai_api.catalog import stamps  # noqa: PLC0415

    def new_connection_each_time() -> Any:
        try:
            return stamps()
        finally:
            connection.close()

    kept = DatabaseThread("bench-route-table")
    check: Callable[[], Awaitable[Any]]
    if way == "kept":
        await kept.run(stamps)  # its connection open, as in a gateway that has run a while
        check = functools.partial(kept.run, stamps)
    else:
        check = functools.partial(
            asyncio.get_running_loop().run_in_executor, None, new_connection_each_time
        )
    opened.clear()
    began, mine, machine = time.perf_counter(), own_cpu(), machine_cpu()
    for _ in range(checks):
        await check()
    figures = {
        "wall_ms": (time.perf_counter() - began) / checks * 1e3,
        "own_cpu_ms": (own_cpu() - mine) / checks * 1e3,
        "machine_cpu_ms": (machine_cpu() - machine) / checks * 1e3,
        "connections": float(len(opened)),
    }
    kept.release()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", help="a PostgreSQL server's URL (its postgres database)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dropped, database = None, None
        if args.postgres:
            url, dropped = postgres_database(args.postgres)
        else:
            database = Path(tmp, "bench.sqlite3")
            url = f"sqlite:///{database}"
        os.environ.update(
            DATABASE_URL=url, MSHIP_VAR_DIR=tmp, DJANGO_SETTINGS_MODULE="modelship_site.settings"
        )
        try:
            run(args.checks, args.rounds, database)
        finally:
            if dropped:
                from django.db import connections  # noqa: PLC0415

                connections.close_all()
                drop = f"DROP DATABASE {dropped} WITH (FORCE)"  # whatever still holds it
                subprocess.run(["psql", args.postgres, "-qc", drop], check=True)


def run(checks: int, rounds: int, database: Path | None) -> None:
    """`database`: the site's SQLite file, where run_all's migrated template goes (None: a
    PostgreSQL database, migrated here)."""
    import django  # noqa: PLC0415

    copied = database is not None and site_db.copy_to(database)
    django.setup()
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connection  # noqa: PLC0415
    from django.db.backends.signals import connection_created  # noqa: PLC0415

    if not copied:
        call_command("migrate", verbosity=0)
    connection.close()
    opened: list[Any] = []
    connection_created.connect(lambda **kwargs: opened.append(1), weak=False)
    ways = ("new connection each check", "kept")
    results: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    for _ in range(rounds):
        for way in ways:
            results[way].append(asyncio.run(measure(way, checks, opened)))
    print(f"{connection.vendor}, {checks} checks x {rounds} rounds (medians)")
    print(f"{'way':28} {'wall ms':>8} {'own CPU ms':>10} {'machine CPU ms':>14} {'opened':>7}")
    for way in ways:
        row = {k: statistics.median(r[k] for r in results[way]) for k in results[way][0]}
        print(
            f"{way:28} {row['wall_ms']:8.2f} {row['own_cpu_ms']:10.2f}"
            f" {row['machine_cpu_ms']:14.2f} {row['connections']:7.0f}"
        )
    if any(r["connections"] > 1 for r in results["kept"]):
        print("the kept connection was opened again: a check failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
