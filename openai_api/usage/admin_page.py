"""The admin's usage page (/admin/usage/, staff who may view API keys): for a range (last hour,
24 hours, 7 or 30 days, or since and until given) and a grouping (team, key or model), the
tokens and the GPU-seconds over time a line per group (the top 8, the rest as "other"), the
top consumers, each one linking to the page narrowed to it, the idle GPU-seconds of each model,
every budget a key or a team sets and how much of it is used, and the CSV of /api/usage/ with
the same filters. Drawn on the server (openai_api/usage/charts.py): it needs no JavaScript."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from rest_framework import serializers

from deployments.api.filters import MAX_ID
from openai_api.api.usage_params import WHEN_HELP, moment
from openai_api.models import ApiKey, shown_prefix
from openai_api.usage import gpu_share
from openai_api.usage.charts import (
    bucket_for,
    bucket_starts,
    figure,
    level_of,
    line_chart,
    percent_bar,
    top_series,
)
from openai_api.usage.models import BUDGETS, Team
from openai_api.usage.report import (
    budget_status,
    budget_text,
    key_labels,
    team_labels,
    usage_rows,
    usage_totals,
)

if TYPE_CHECKING:
    from django.http import HttpRequest

    from openai_api.usage.charts import Series

PRESETS = {
    "1h": ("last hour", timedelta(hours=1)),
    "24h": ("24 hours", timedelta(hours=24)),
    "7d": ("7 days", timedelta(days=7)),
    "30d": ("30 days", timedelta(days=30)),
}
DEFAULT_PRESET = "24h"
GROUPINGS = ("team", "key", "model")
DEFAULT_GROUPING = "team"
MAX_SPAN = timedelta(days=400)  # a day per point: at most 400 points
TABLE_ROWS = 25
# Narrowed to one of a grouping, the page groups by what splits it next.
NEXT_GROUPING = {"key": "model", "team": "key", "model": "key"}
CHARTS = (("tokens", "tokens", "Tokens"), ("gpu_seconds", "GPU-seconds", "GPU-seconds"))
PARAMS = ("range", "since", "until", "by", "key", "team", "model")


class UsageForm(forms.Form):
    range = forms.ChoiceField(
        choices=[(name, label) for name, (label, _) in PRESETS.items()], required=False
    )
    since = forms.CharField(required=False, max_length=64, help_text=WHEN_HELP)
    until = forms.CharField(required=False, max_length=64, help_text="Empty: now.")
    by = forms.ChoiceField(
        choices=[(name, name) for name in GROUPINGS], required=False, label="Group by"
    )
    key = forms.IntegerField(required=False, min_value=0, max_value=MAX_ID)
    team = forms.IntegerField(required=False, min_value=0, max_value=MAX_ID)
    model = forms.CharField(required=False, max_length=200)

    def clean(self) -> dict[str, Any]:
        """The range as `start` and `end`: since and until where given (a preset's span before
        until where only until is), else the preset's span before now."""
        data = super().clean() or {}
        now = timezone.now()
        times: dict[str, datetime] = {}
        for name in ("since", "until"):
            text = (data.get(name) or "").strip()
            if text:
                try:
                    times[name] = moment(text, now)
                except serializers.ValidationError as exc:
                    self.add_error(name, " ".join(str(e) for e in exc.detail))
        if self.errors:
            return data
        span = PRESETS[data.get("range") or DEFAULT_PRESET][1]
        end = times.get("until", now)
        start = times.get("since", end - span)
        if start >= end:
            self.add_error("until", "Must be later than since.")
        elif end - start > MAX_SPAN:
            self.add_error("since", f"At most {MAX_SPAN.days} days: narrow since and until.")
        return {**data, "start": start, "end": end, "by": data.get("by") or DEFAULT_GROUPING}


def usage_page(request: HttpRequest, context: dict[str, Any]) -> TemplateResponse:
    """The page; `context` is the admin site's (each_context)."""
    if not request.user.has_perm("openai_api.view_apikey"):
        raise PermissionDenied
    form = UsageForm(request.GET)
    current = {name: request.GET.get(name, "") for name in PARAMS}
    page: dict[str, Any] = {**context, "title": "Usage", "form": form, "current": current}
    page["presets"] = preset_links(current)
    if form.is_valid():
        page.update(report(form.cleaned_data, current))
    return TemplateResponse(request, "admin/usage.html", page)


def link(params: dict[str, Any]) -> str:
    """This page's query with these parameters (empty ones left out)."""
    return "?" + urlencode({k: v for k, v in params.items() if v not in (None, "")})


def preset_links(current: dict[str, str]) -> list[dict[str, Any]]:
    """A link per preset range, keeping the grouping and what the page is narrowed to."""
    chosen = "" if current["since"] or current["until"] else current["range"] or DEFAULT_PRESET
    return [
        {
            "label": label,
            "url": link({**current, "range": name, "since": "", "until": ""}),
            "chosen": name == chosen,
        }
        for name, (label, _) in PRESETS.items()
    ]


def label_of(row: dict[str, Any], group: str) -> str:
    """A report row's group as the page names it: a key's name and prefix, a team's or a
    model's name."""
    if group == "key":
        return f"{row['key']} ({row['key_prefix']})" if row["key_prefix"] else str(row["key"])
    return str(row[group])


def narrowed_to(choice: dict[str, Any]) -> list[str]:
    """What the page is narrowed to, as it reads: "key ci (msk-1a2b)", "team research"."""
    shown = []
    if choice.get("key") is not None:
        name, prefix = key_labels([choice["key"]])[choice["key"]]
        shown.append(f"key {name} ({prefix})" if prefix else f"key {name}")
    if choice.get("team") is not None:
        shown.append(f"team {team_labels([choice['team']])[choice['team']]}")
    if choice.get("model"):
        shown.append(f"model {choice['model']}")
    return shown


def report(choice: dict[str, Any], current: dict[str, str]) -> dict[str, Any]:
    """What the page shows for a valid choice."""
    since, until, group = choice["start"], choice["end"], choice["by"]
    filters = {
        "key_id": choice.get("key"),
        "team_id": choice.get("team"),
        "deployment": choice.get("model") or None,
    }
    bucket = bucket_for(until - since)
    starts = bucket_starts(since, until, bucket)
    rows = usage_rows(since, until, by=(group, bucket), **filters)
    charts = []
    for metric, unit, title in CHARTS:
        series: list[Series] = top_series(
            ((label_of(r, group), r["time"], r[metric]) for r in rows), starts
        )
        charts.append(
            {
                "title": f"{title} per {bucket}",
                "svg": line_chart(series, starts, bucket, unit),
            }
        )
    idle = group == "model" and filters["key_id"] is None and filters["team_id"] is None
    consumers, more = top_table(since, until, group, filters, current, idle=idle)
    return {
        "since": since,
        "until": until,
        "group": group,
        "bucket": bucket,
        "narrowed": narrowed_to(choice),
        "clear_url": link({**current, "key": "", "team": "", "model": ""}),
        "totals": totals_text(usage_totals(since, until, **filters)),
        "charts": charts,
        "consumers": consumers,
        "more": more,
        "idle": idle,
        "budgets": budget_rows(current),
        "csv": csv_links(since, until, group, bucket, choice),
    }


def top_table(
    since: datetime,
    until: datetime,
    group: str,
    filters: dict[str, Any],
    current: dict[str, str],
    *,
    idle: bool,
) -> tuple[list[dict[str, Any]], int]:
    """The groups that used most, most tokens first (then GPU-seconds, requests), each
    linking to the page narrowed to it; and how many more there are past TABLE_ROWS."""
    rows = [
        row
        for row in usage_rows(since, until, by=(group,), **filters)
        if row["tokens"]
        or row["gpu_seconds"]
        or row["requests"]
        or row.get("idle_gpu_seconds")
        or row.get("load_gpu_seconds")
    ]
    rows.sort(key=lambda r: (-r["tokens"], -r["gpu_seconds"], -r["requests"], label_of(r, group)))
    table = []
    for row in rows[:TABLE_ROWS]:
        narrowed = {"key": row.get("key_id"), "team": row.get("team_id"), "model": row.get("model")}
        table.append(
            {
                "name": label_of(row, group),
                "url": link({**current, group: narrowed[group], "by": NEXT_GROUPING[group]}),
                "tokens": figure(row["tokens"], "tokens"),
                "gpu_seconds": figure(row["gpu_seconds"], "GPU-seconds"),
                "requests": figure(row["requests"], "requests"),
                "errors": figure(row["errors"], "errors"),
                "estimated": (
                    f"{row['tokens_estimated'] / row['tokens'] * 100:.0f}%"
                    if row["tokens"]
                    else "-"
                ),
                **{
                    name: figure(row.get(name) or 0, "GPU-seconds") if idle else ""
                    for name in ("load_gpu_seconds", "idle_gpu_seconds")
                },
            }
        )
    return table, max(0, len(rows) - TABLE_ROWS)


def totals_text(totals: dict[str, Any]) -> list[str]:
    """The range's totals, a phrase each."""
    shown = [
        f"{figure(totals['tokens'], 'tokens')} tokens",
        f"{figure(totals['gpu_seconds'], 'GPU-seconds')} GPU-seconds",
        f"{figure(totals['requests'], 'requests')} requests",
        f"{figure(totals['errors'], 'errors')} errors",
    ]
    if "idle_gpu_seconds" in totals:
        shown.append(f"{figure(totals['load_gpu_seconds'], 'GPU-seconds')} loading GPU-seconds")
        shown.append(f"{figure(totals['idle_gpu_seconds'], 'GPU-seconds')} idle GPU-seconds")
    if gpu_share.basis() == gpu_share.BUDGET:
        shown.append("(no GPU here: a GPU-second is a second of the whole memory budget)")
    return shown


def budget_rows(current: dict[str, str]) -> list[dict[str, Any]]:
    """Every team and every key not revoked that sets a budget, with a bar per budget: what
    is used of it this UTC day or month, its percent, when it resets. A warning colour at
    MSHIP_BUDGET_WARN_PERCENT, another at 100%."""
    sets_one = Q()
    for field, _, _ in BUDGETS:
        sets_one |= Q(**{f"{field}__isnull": False})
    now = timezone.now()
    warn = float(settings.MSHIP_BUDGET_WARN_PERCENT)
    owners: list[tuple[str, str, int, ApiKey | Team]] = [
        ("team", team.name, team.pk, team) for team in Team.objects.filter(sets_one)
    ]
    keys = ApiKey.objects.filter(sets_one, revoked=False).order_by("name", "pk")
    owners += [("key", f"{k.name} ({shown_prefix(k.prefix)})", k.pk, k) for k in keys]
    shown = []
    for kind, name, pk, obj in owners:
        status = budget_status(obj, now=now)
        lines = [
            {
                "text": text,
                "percent": f"{each['percent']:.0f}",
                "level": level_of(each["percent"], warn),
                "bar": percent_bar(each["percent"], warn),
                "resets_at": each["resets_at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            }
            for each, text in zip(status, budget_text(status), strict=True)
        ]
        narrowed = {"key": "", "team": "", "model": "", kind: pk, "by": NEXT_GROUPING[kind]}
        url = link({**current, **narrowed})
        shown.append({"kind": kind, "name": name, "url": url, "lines": lines})
    return shown


def csv_links(
    since: datetime, until: datetime, group: str, bucket: str, choice: dict[str, Any]
) -> dict[str, str]:
    """/api/usage/ as CSV for the same range and filters: per group and bucket (the charts'
    figures), and per group (the table's)."""
    params = {
        "format": "csv",
        "since": since.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "until": until.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "key": choice.get("key"),
        "team": choice.get("team"),
        "model": choice.get("model"),
    }
    api = reverse("usage")
    return {
        "series": api + link({**params, "by": f"{group},{bucket}"}),
        "table": api + link({**params, "by": group}),
    }
