"""`modelship usage` and `modelship teams`, and `keys create --team` with budgets, against a
live Modelship (`manage.py serve`): the table an operator reads, the JSON and CSV a script
reads, and the exit code of a refused query."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta
from typing import TYPE_CHECKING

from django.utils import timezone

from openai_api.models import ApiKey
from openai_api.usage.models import Team, UsageMinute
from tests.test_cli import cli

if TYPE_CHECKING:
    from datetime import datetime


def used(minute: datetime, **fields: object) -> None:
    UsageMinute.objects.create(minute=minute, **fields)


def test_it_reports_usage_and_manages_teams_and_budgeted_keys(live: dict[str, str]) -> None:
    made = cli(live, "teams", "create", "research", "--tokens-per-day", "10000")
    assert made.returncode == 0, made.stderr
    team = Team.objects.get(name="research")
    assert made.stdout.strip() == f"team research (id {team.pk})"
    key_made = cli(
        live, "keys", "create", "ci", "--team", "research", "--tokens-per-day", "1000",
        "--gpu-seconds-per-month", "3600",
    )  # fmt: skip
    assert key_made.returncode == 0, key_made.stderr
    key = ApiKey.objects.get(name="ci")
    assert (key.team, key.tokens_per_day, key.gpu_seconds_per_month) == (team, 1000, 3600)
    assert key.tokens_per_month is None
    refused = cli(live, "keys", "create", "x", "--team", "nobody")
    assert refused.returncode == 1 and "team: No team 'nobody'" in refused.stderr

    now = timezone.now()
    # An hour ago, but today (UTC): the day's budgets count it.
    start = max(now - timedelta(hours=1), now.replace(hour=0, minute=0)).replace(
        second=0, microsecond=0
    )
    mine = {"key_id": key.pk, "team_id": team.pk}
    used(start, deployment="chat", requests=3, tokens_in=1200, tokens_out=34, ttft_s=0.6,
         ttft_count=3, gpu_seconds=12.5, **mine)  # fmt: skip
    used(start, deployment="embed", requests=2, tokens_in=5000, errors=1)
    used(start - timedelta(days=3), deployment="chat", requests=99, **mine)  # before --since

    table = cli(live, "usage", "--by", "model", "--since", "2h")
    assert table.returncode == 0, table.stderr
    title, header, *rows = table.stdout.splitlines()
    assert title.startswith("usage from ") and title.endswith(" UTC, by model")
    assert header.split() == [
        "MODEL", "REQUESTS", "ERRORS", "TOKENS", "IN", "TOKENS", "OUT", "CACHED", "GPU-S", "TTFT",
    ]  # fmt: skip
    cells = {row.split()[0]: row.split()[1:] for row in rows if row.strip()}
    assert cells["chat"] == ["3", "0", "1,200", "34", "0", "12.5", "0.20s"]
    assert cells["embed"] == ["2", "1", "5,000", "0", "0", "0.0", "-"]
    assert cells["TOTAL"] == ["5", "1", "6,200", "34", "0", "12.5", "0.20s"]

    by_key = cli(live, "usage", "--since", "2h", "--team", "research", "--json")
    report = json.loads(by_key.stdout)
    assert report["by"] == ["key"]
    assert [(r["key"], r["key_prefix"], r["tokens"]) for r in report["rows"]] == [
        ("ci", f"msk-{key.prefix}", 1234)
    ]
    keyed = cli(live, "usage", "--since", "2h", "--key", f"msk-{key.prefix}")
    assert f"ci (msk-{key.prefix})" in keyed.stdout
    exported = cli(live, "usage", "--since", "2h", "--by", "model,hour", "--csv")
    header_row, *data = list(csv.reader(io.StringIO(exported.stdout)))
    assert header_row[:4] == ["time", "model", "requests", "errors"]
    assert sorted(row[1] for row in data) == ["chat", "embed"]

    listed = cli(live, "teams", "list")
    assert listed.returncode == 0, listed.stderr
    header_line, team_line = listed.stdout.strip().splitlines()
    assert header_line.split() == ["ID", "NAME", "KEYS", "BUDGETS"]
    assert re.split(r"\s{2,}", team_line.strip()) == [
        str(team.pk), "research", "1", "tokens/day 1,234 of 10,000 (12%)",
    ]  # fmt: skip

    wrong = cli(live, "usage", "--by", "week")
    assert wrong.returncode == 1 and "by: 'week' is not one of" in wrong.stderr
