"""Usage as it is read back: UsageMinute rows summed by key, team or model and by minute, hour
or day; a deployment's idle GPU-seconds; the top consumers; how much of its budgets a key or
a team has used. Pure ORM: /api/usage/, the admin and `modelship usage` read it here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from deployments.models import Deployment
from openai_api.models import ApiKey, shown_prefix
from openai_api.usage.held import BUCKETS, held_gpu_seconds
from openai_api.usage.models import BUDGETS, COUNTED, Team, UsageMinute
from openai_api.usage.periods import resets_at, start_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

# What a row sums, in the order a report shows it: every counted field but the time to first
# token's parts (a report shows their mean).
SUMMED = tuple(name for name in COUNTED if name not in ("ttft_s", "ttft_count"))
# The columns of a report row after its group's: `tokens` is in plus out, `ttft_mean_s` the
# mean time to the first token of the requests that measured one.
COLUMNS = (*SUMMED[:4], "tokens", *SUMMED[4:8], "ttft_mean_s", *SUMMED[8:])
GROUPS = {"key": "key_id", "team": "team_id", "model": "deployment"}
BY_CHOICES = (*GROUPS, *BUCKETS)
MAX_BUCKETS = 10_000  # time buckets one report may have (a month by minute is 43,200)
# A deployment's own accounts beside its requests': loading (starts and wakes) and idle.
ACCOUNTS = ("load_gpu_seconds", "idle_gpu_seconds")


def budget_sums(what: str) -> tuple[str, ...]:
    """The UsageMinute fields a budget of `what` counts (loads too, where
    MSHIP_USAGE_BUDGET_LOADS says GPU-second budgets count them)."""
    if what == "tokens":
        return ("tokens_in", "tokens_out")
    if what == "gpu_seconds" and settings.MSHIP_USAGE_BUDGET_LOADS:
        return ("gpu_seconds", "load_gpu_seconds")
    return (what,)


def check_by(by: Sequence[str], since: datetime, until: datetime) -> tuple[str, ...]:
    """The grouping, checked: at most one of key, team and model and at most one time bucket,
    no more buckets than MAX_BUCKETS. A ValueError says what is wrong."""
    chosen = tuple(by)
    unknown = [b for b in chosen if b not in BY_CHOICES]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not one of {', '.join(BY_CHOICES)}.")
    if len(set(chosen)) < len(chosen):
        raise ValueError("Each grouping at most once.")
    if len([b for b in chosen if b in GROUPS]) > 1:
        raise ValueError("At most one of key, team and model.")
    buckets = [b for b in chosen if b in BUCKETS]
    if len(buckets) > 1:
        raise ValueError("At most one of minute, hour and day.")
    if buckets and (until - since) / BUCKETS[buckets[0]] > MAX_BUCKETS:
        raise ValueError(
            f"More than {MAX_BUCKETS:,} {buckets[0]}s: narrow since and until, or group by a"
            " longer time."
        )
    return chosen


def usage_of(
    since: datetime,
    until: datetime,
    *,
    key_id: int | None = None,
    team_id: int | None = None,
    deployment: str | None = None,
) -> QuerySet[UsageMinute]:
    """The usage rows of the minutes from `since` (included) to `until` (not included)."""
    rows = UsageMinute.objects.filter(minute__gte=since, minute__lt=until)
    if key_id is not None:
        rows = rows.filter(key_id=key_id)
    if team_id is not None:
        rows = rows.filter(team_id=team_id)
    if deployment is not None:
        rows = rows.filter(deployment=deployment)
    return rows.order_by()


def counters(sums: dict[str, Any]) -> dict[str, Any]:
    """A row's counters from its sums: None (no rows) as 0, floats to the millisecond."""
    row: dict[str, Any] = {name: sums.get(name) or 0 for name in SUMMED}
    row["tokens"] = row["tokens_in"] + row["tokens_out"]
    count = sums.get("ttft_count") or 0
    row["ttft_mean_s"] = round((sums.get("ttft_s") or 0) / count, 3) if count else None
    for name in ("gpu_seconds", "duration_s", "audio_s", "load_gpu_seconds"):
        row[name] = round(float(row[name]), 3)
    return {name: row[name] for name in COLUMNS}


SUMS = {name: Sum(name) for name in (*SUMMED, "ttft_s", "ttft_count")}


def key_labels(ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """Each key id's (name, prefix); a deleted key's name says so; 0 is no key."""
    wanted = set(ids)
    found = ApiKey.objects.filter(pk__in=wanted - {0}).values_list("pk", "name", "prefix")
    labels = {pk: (name, shown_prefix(prefix)) for pk, name, prefix in found}
    for pk in wanted - set(labels):
        labels[pk] = ("(no key)", "") if pk == 0 else (f"key #{pk} (deleted)", "")
    return labels


def team_labels(ids: Iterable[int]) -> dict[int, str]:
    """Each team id's name; a deleted team's says so; 0 is no team."""
    wanted = set(ids)
    labels = dict(Team.objects.filter(pk__in=wanted - {0}).values_list("pk", "name"))
    for pk in wanted - set(labels):
        labels[pk] = "(no team)" if pk == 0 else f"team #{pk} (deleted)"
    return labels


def grouped(rows: list[dict[str, Any]], group: str | None) -> list[dict[str, Any]]:
    """Rows with their group's id (`_id`) shown as a user reads it: a key's id, name and
    prefix; a team's id and name; a model's name."""
    if group == "key":
        keys = key_labels(row["_id"] for row in rows)
        return [
            {"key_id": pk, "key": keys[pk][0], "key_prefix": keys[pk][1], **row}
            for row in rows
            if (pk := row.pop("_id")) is not None
        ]
    if group == "team":
        teams = team_labels(row["_id"] for row in rows)
        return [
            {"team_id": pk, "team": teams[pk], **row}
            for row in rows
            if (pk := row.pop("_id")) is not None
        ]
    if group == "model":
        return [{"model": row.pop("_id"), **row} for row in rows]
    return rows


def usage_rows(
    since: datetime,
    until: datetime,
    *,
    key_id: int | None = None,
    team_id: int | None = None,
    deployment: str | None = None,
    by: Sequence[str] = ("key",),
) -> list[dict[str, Any]]:
    """Usage from `since` to `until`, summed per group: `by` is one of key, team and model
    and/or one of minute, hour and day (a row per UTC time bucket, its start as `time`).
    Grouped by model and not narrowed to a key or a team, each row also has the model's
    `idle_gpu_seconds`, and a model that held GPUs with no request has a row too. Ordered
    by time, then by the group's name."""
    chosen = check_by(by, since, until)
    group = next((b for b in chosen if b in GROUPS), None)
    bucket = next((b for b in chosen if b in BUCKETS), None)
    queryset = usage_of(since, until, key_id=key_id, team_id=team_id, deployment=deployment)
    fields = []
    if bucket is not None:
        queryset = queryset.annotate(time=Trunc("minute", bucket, tzinfo=UTC))
        fields.append("time")
    if group is not None:
        fields.append(GROUPS[group])
    raw = list(queryset.values(*fields).annotate(**SUMS))
    rows = []
    for sums in raw:
        row: dict[str, Any] = {"time": sums["time"]} if bucket else {}
        if group is not None:
            row["_id"] = sums[GROUPS[group]]
        rows.append({**row, **counters(sums)})
    idle = group == "model" and key_id is None and team_id is None
    if idle:
        rows = with_idle(rows, since, until, bucket, deployment)
    columns = row_columns(chosen, idle=idle)
    shown = [{name: row[name] for name in columns} for row in grouped(rows, group)]
    label = {"key": "key", "team": "team", "model": "model"}.get(group or "", "")
    return sorted(shown, key=lambda r: (r.get("time") or since, str(r.get(label, ""))))


def row_columns(by: Sequence[str], *, idle: bool = False) -> tuple[str, ...]:
    """A report row's columns, in order: its time bucket's start, its group's, the counters,
    and (grouped by model, `idle`) the model's idle GPU-seconds."""
    labels = {"key": ("key_id", "key", "key_prefix"), "team": ("team_id", "team")}
    front: list[str] = ["time"] if any(b in BUCKETS for b in by) else []
    for group in (b for b in by if b in GROUPS):
        front.extend(labels.get(group, (group,)))
    accounts = ACCOUNTS if idle and "model" in by else ()
    # By model, the load column is the deployment's whole load account, last.
    return (*front, *(c for c in COLUMNS if c not in accounts), *accounts)


def with_idle(
    rows: list[dict[str, Any]],
    since: datetime,
    until: datetime,
    bucket: str | None,
    deployment: str | None,
) -> list[dict[str, Any]]:
    """Rows by model (and time bucket) with each one's load and idle GPU-seconds: what it
    spent starting and waking, and what it held less that and what its requests were
    charged, at least 0."""
    by_place = {(row.get("time"), row["_id"]): row for row in rows}
    for row in rows:
        row["idle_gpu_seconds"] = 0.0
    deployments = Deployment.objects.all()
    if deployment is not None:
        deployments = deployments.filter(name=deployment)
    end = min(until, timezone.now())
    for each in deployments:
        for opened, (held, load) in held_gpu_seconds(each, since, end, bucket).items():
            place = (opened, each.name)
            if place not in by_place:
                empty = counters({})
                by_place[place] = {**({"time": opened} if bucket else {}), "_id": each.name}
                by_place[place].update(empty)
            row = by_place[place]
            row["load_gpu_seconds"] = round(load, 3)
            row["idle_gpu_seconds"] = round(max(0.0, held - load - row["gpu_seconds"]), 3)
    return list(by_place.values())


def idle_gpu_seconds(deployment: Deployment, since: datetime, until: datetime) -> float:
    """What the deployment held from `since` to `until` (not past now) less its load and
    the GPU-seconds its requests were charged in that time, at least 0."""
    return own_accounts(deployment, since, until)[1]


def own_accounts(deployment: Deployment, since: datetime, until: datetime) -> tuple[float, float]:
    """The deployment's load and idle GPU-seconds from `since` to `until` (not past now)."""
    end = min(until, timezone.now())
    held, load = held_gpu_seconds(deployment, since, end).get(None, (0.0, 0.0))
    if not held:
        return 0.0, 0.0
    used = usage_of(since, until, deployment=deployment.name).aggregate(s=Sum("gpu_seconds"))
    return round(load, 3), round(max(0.0, held - load - (used["s"] or 0.0)), 3)


def usage_totals(
    since: datetime,
    until: datetime,
    *,
    key_id: int | None = None,
    team_id: int | None = None,
    deployment: str | None = None,
) -> dict[str, Any]:
    """The report's counters summed over every row; not narrowed to a key or a team, also the
    deployments' load and idle GPU-seconds (each over the whole range)."""
    queryset = usage_of(since, until, key_id=key_id, team_id=team_id, deployment=deployment)
    totals = counters(queryset.aggregate(**SUMS))
    if key_id is None and team_id is None:
        deployments = Deployment.objects.all()
        if deployment is not None:
            deployments = deployments.filter(name=deployment)
        accounts = [own_accounts(each, since, until) for each in deployments]
        totals["load_gpu_seconds"] = round(sum(load for load, _ in accounts), 3)
        totals["idle_gpu_seconds"] = round(sum(idle for _, idle in accounts), 3)
    return totals


def top_consumers(
    since: datetime, until: datetime, by: str, limit: int = 10, *, metric: str = "tokens"
) -> list[dict[str, Any]]:
    """The keys, teams or models (`by`) that used the most of `metric` (a report column:
    tokens, gpu_seconds, requests…), most first; those that used none are left out."""
    if by not in GROUPS or metric not in COLUMNS:
        raise ValueError(f"by one of {', '.join(GROUPS)}; metric one of {', '.join(COLUMNS)}")
    rows = [r for r in usage_rows(since, until, by=(by,)) if r[metric]]
    return sorted(rows, key=lambda r: r[metric], reverse=True)[:limit]


def used_so_far(obj: ApiKey | Team, now: datetime) -> dict[str, float]:
    """What the key or the team used of each thing a budget counts, this UTC day and month:
    {budget field: used}. A team's is every row recorded for it."""
    day, month = start_of("day", now), start_of("month", now)
    owner = Q(team_id=obj.pk) if isinstance(obj, Team) else Q(key_id=obj.pk)
    sums: dict[str, Sum] = {}
    for field, what, period in BUDGETS:
        start = day if period == "day" else month
        for name in budget_sums(what):
            sums[f"{field}__{name}"] = Sum(name, filter=Q(minute__gte=start))
    found = UsageMinute.objects.filter(owner, minute__gte=min(day, month)).aggregate(**sums)
    return {
        field: float(sum(found[f"{field}__{n}"] or 0 for n in budget_sums(what)))
        for field, what, _ in BUDGETS
    }


def budget_status(
    obj: ApiKey | Team, used: dict[str, float] | None = None, *, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Each budget the key or the team sets: its limit, what was used of it this UTC day or
    month (`used`, {budget field: figure}, where the caller has live figures; else the usage
    table's), the share used in percent, and when it resets (the next UTC midnight, or the
    first of the next month)."""
    now = now or timezone.now()
    limits = obj.budgets()
    if not limits:
        return []
    figures = used if used is not None else used_so_far(obj, now)
    periods = {field: (what, period) for field, what, period in BUDGETS}
    status = []
    for field, limit in limits:
        what, period = periods[field]
        spent = float(figures.get(field, 0.0))
        percent = min(spent / limit * 100, 999.9) if limit else (100.0 if spent else 0.0)
        status.append(
            {
                "budget": field,
                "counts": what,
                "period": period,
                "limit": limit,
                "used": round(spent, 3) if what == "gpu_seconds" else int(spent),
                "percent": round(percent, 1),
                "resets_at": resets_at(period, now),
            }
        )
    return status


def budget_text(status: list[dict[str, Any]]) -> list[str]:
    """Each budget as a line reads it: "tokens/day 1,234 of 10,000 (12%)"."""
    names = {"tokens": "tokens", "gpu_seconds": "GPU-s", "requests": "requests"}
    return [
        f"{names[s['counts']]}/{s['period']} {s['used']:,.0f} of {s['limit']:,}"
        f" ({s['percent']:.0f}%)"
        for s in status
    ]
