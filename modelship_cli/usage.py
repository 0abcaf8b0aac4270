"""modelship usage | teams, and the budget options of `keys create`: what keys, teams and
models used (/api/usage/), and the teams their budgets bind (/api/teams/)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from modelship_cli.client import OK

if TYPE_CHECKING:
    import argparse

    from modelship_cli.client import Api

# (option, the API's field, help): the budgets a key or a team may set.
BUDGET_OPTIONS = (
    ("--tokens-per-day", "tokens_per_day", "input plus output tokens per UTC day"),
    ("--tokens-per-month", "tokens_per_month", "tokens per calendar month"),
    ("--gpu-seconds-per-day", "gpu_seconds_per_day", "GPU-seconds per UTC day"),
    ("--gpu-seconds-per-month", "gpu_seconds_per_month", "GPU-seconds per calendar month"),
    ("--requests-per-day", "requests_per_day", "requests per UTC day"),
)
# Counter columns: (header, the row's field, how it is written).
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("REQUESTS", "requests", "int"),
    ("ERRORS", "errors", "int"),
    ("TOKENS IN", "tokens_in", "int"),
    ("TOKENS OUT", "tokens_out", "int"),
    ("CACHED", "tokens_cached", "int"),
    ("GPU-S", "gpu_seconds", "float"),
    ("LOAD GPU-S", "load_gpu_seconds", "float"),
    ("IDLE GPU-S", "idle_gpu_seconds", "float"),
    ("TTFT", "ttft_mean_s", "seconds"),
    ("IMAGES", "images", "int"),
    ("AUDIO S", "audio_s", "float"),
    ("CHARACTERS", "characters", "int"),
)
# Shown only where some row has one: most sites serve no images, audio or speech.
SPARSE = {"load_gpu_seconds", "idle_gpu_seconds", "images", "audio_s", "characters"}
THINGS = {"tokens": "tokens", "gpu_seconds": "GPU-s", "requests": "requests"}

out = Console(highlight=False)


def add_budget_options(parser: argparse.ArgumentParser) -> None:
    for option, _, text in BUDGET_OPTIONS:
        parser.add_argument(option, type=int, help=f"{text} (default: no limit)")


def budget_body(args: argparse.Namespace) -> dict[str, int]:
    """The budgets given on the command line, as the API's fields."""
    chosen = ((field, getattr(args, field)) for _, field, _ in BUDGET_OPTIONS)
    return {field: value for field, value in chosen if value is not None}


def number(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "seconds":
        return f"{value:.2f}s"
    if kind == "float":
        return f"{value:,.1f}"
    return f"{value:,}"


def when(value: str, by: list[str]) -> str:
    """A bucket's start as a line reads it: to the minute, or the date for days."""
    text = value.replace("T", " ").removesuffix("Z").removesuffix("+00:00")
    return text[:10] if "day" in by else text[:16]


def group_cells(row: dict[str, Any], by: list[str]) -> list[str]:
    cells = [when(row["time"], by)] if "time" in row else []
    if "key" in by:
        prefix = row.get("key_prefix")
        cells.append(f"{row['key']} ({prefix})" if prefix else str(row["key"]))
    if "team" in by:
        cells.append(str(row["team"]))
    if "model" in by:
        cells.append(str(row["model"]))
    return cells


def group_headers(by: list[str]) -> list[str]:
    time = ["TIME (UTC)"] if any(b in ("minute", "hour", "day") for b in by) else []
    return time + [b.upper() for b in by if b in ("key", "team", "model")]


def usage_table(answer: dict[str, Any]) -> Table:
    """The report's rows as a table, then a TOTAL row; counters no row has are left out."""
    rows, by, totals = answer["rows"], answer["by"], answer["totals"]
    present = [c for c in COUNTERS if c[1] in totals or any(c[1] in r for r in rows)]
    shown = [c for c in present if c[1] not in SPARSE or any(r.get(c[1]) for r in [*rows, totals])]
    table = Table(box=None, pad_edge=False, header_style="bold")
    headers = group_headers(by)
    for header in headers:
        table.add_column(header, overflow="fold")
    for header, _, _ in shown:
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*group_cells(row, by), *(number(row.get(f), k) for _, f, k in shown))
    if headers:
        blanks = [""] * (len(headers) - 1)
        table.add_section()
        table.add_row("TOTAL", *blanks, *(number(totals.get(f), k) for _, f, k in shown))
    return table


def usage(api: Api, args: argparse.Namespace) -> int:
    params = {"since": args.since, "by": args.by}
    optional = {"until": args.until, "model": args.model, "key": args.key, "team": args.team}
    params.update({name: value for name, value in optional.items() if value is not None})
    if args.csv:
        answer = api.send("GET", "/api/usage/", params={**params, "format": "csv"})
        sys.stdout.write(answer.text)
        return OK
    report = api.get("/api/usage/", **params)
    if args.json:
        print(json.dumps(report))
        return OK
    since, until = (when(report[k], []) for k in ("since", "until"))
    out.print(f"usage from {since} to {until} UTC, by {', '.join(report['by'])}", markup=False)
    out.print(usage_table(report))
    if report.get("gpu_seconds_basis") == "memory budget":
        out.print("no GPU on this host: a GPU-second is a second of the whole memory budget")
    return OK


def budget_lines(status: list[dict[str, Any]]) -> str:
    """Each budget as "tokens/day 1,234 of 10,000 (12%)", or "-" where none is set."""
    return (
        "; ".join(
            f"{THINGS.get(s['counts'], s['counts'])}/{s['period']} {s['used']:,.0f} of"
            f" {s['limit']:,} ({s['percent']:.0f}%)"
            for s in status
        )
        or "-"
    )


def teams(api: Api, args: argparse.Namespace) -> int:
    if args.action == "create":
        body: dict[str, Any] = {"name": args.name, **budget_body(args)}
        if args.description:
            body["description"] = args.description
        made = api.post("/api/teams/", body)
        out.print(f"team {made['name']} (id {made['id']})", markup=False)
        return OK
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in ("ID", "NAME", "KEYS", "BUDGETS"):
        table.add_column(header, overflow="fold")
    for row in api.pages("/api/teams/"):
        budgets = budget_lines(row.get("budget_status") or [])
        table.add_row(str(row["id"]), row["name"], str(row["keys"]), budgets)
    out.print(table)
    return OK


def add_parsers(sub: Any) -> None:
    """`usage` and `teams`, each with its handler."""
    report = sub.add_parser("usage", help="what keys, teams and models used: tokens, GPU-seconds")
    report.add_argument(
        "--by",
        default="key",
        help="key, team or model, and/or minute, hour or day: model,hour (default key)",
    )
    report.add_argument("--since", default="24h", help="ISO 8601 or a time ago: 30m, 24h, 7d")
    report.add_argument("--until", help="ISO 8601 or a time ago (default: now)")
    report.add_argument("--model", help="one deployment's")
    report.add_argument("--key", help="one key's: its id, msk- prefix or name")
    report.add_argument("--team", help="one team's: its id or name")
    shape = report.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="the API's answer, for scripts")
    shape.add_argument("--csv", action="store_true", help="CSV with a header row")
    report.set_defaults(handler=usage)
    team = sub.add_parser("teams", help="teams of keys and their budgets")
    team_sub = team.add_subparsers(dest="action", required=True)
    team_sub.add_parser("list")
    create = team_sub.add_parser("create")
    create.add_argument("name")
    create.add_argument("--description", default="")
    add_budget_options(create)
    team.set_defaults(handler=teams)
