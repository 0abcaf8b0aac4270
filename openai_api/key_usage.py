"""GET /v1/usage: a key holder's own view, authenticated by the key itself: what the key used
today and this month, each budget of the key and of its team (limit, used, what is left, when
it resets), and its requests-per-minute window.

A key only ever sees its own figures: the endpoint takes no key id, and any query parameter
is refused (400), so `?key=` cannot name another. Budgets' "used" is what the budget check
itself counts where this process has it live (every process's totals plus its own since:
openai_api/usage/budgets.py); else the usage table's, with what this process has not written
yet. The database is read off the event loop, in one unit of work.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from django.utils import timezone

from common.db_calls import off_loop
from openai_api.errors import GatewayError
from openai_api.models import ApiKey, shown_prefix
from openai_api.usage.budgets import Owner, budgets
from openai_api.usage.ledger import Row, ledger
from openai_api.usage.models import BUDGETS, COUNTED
from openai_api.usage.periods import period_id, start_of
from openai_api.usage.report import budget_status, budget_sums, usage_totals

if TYPE_CHECKING:
    from openai_api.auth import Caller
    from openai_api.catalog import Key
    from openai_api.exchange import Exchange
    from openai_api.limit_headers import Left

PATH = "usage"  # under /v1
# The counters a key holder is shown, of the usage table's columns (`tokens`: in plus out).
SHOWN = (
    "requests",
    "tokens_in",
    "tokens_out",
    "tokens",
    "tokens_cached",
    "gpu_seconds",
    "load_gpu_seconds",  # its share of the starts and wakes its requests waited for
)
# A key's figures are read again at most this often per process (each read is four sums
# over the usage table): a key asking in a loop costs the database little.
FRESH_S = 1.0
MAX_KEPT = 10_000
recent: dict[int, tuple[float, dict[str, Any]]] = {}


async def answer(exchange: Exchange, caller: Caller, rpm: Left | None) -> None:
    scope = exchange.scope
    if scope["method"] not in ("GET", "HEAD"):
        raise GatewayError(
            405, f"{scope['method']} is not allowed on {scope['path']}.", "method_not_allowed"
        )
    key = caller.key
    if key is None:
        raise GatewayError(
            403,
            "Usage is counted per API key, and this request came without one (this site lets"
            " callers in without a key): there are no figures of its own to show.",
            "api_key_required",
        )
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    if query:
        name = query[0][0]
        raise GatewayError(
            400,
            f"Unknown parameter {name[:64]!r}: /v1/usage takes none (a key sees its own usage).",
            "unknown_parameter",
            param=name[:64],
        )
    kept = recent.get(key.id)
    if kept is not None and time.monotonic() - kept[0] < FRESH_S:
        body = dict(kept[1])
    else:
        body = await off_loop(figures, key, timezone.now())
        if len(recent) >= MAX_KEPT:
            recent.clear()
        recent[key.id] = (time.monotonic(), dict(body))
    body["rate_limits"] = {
        "requests_per_minute": None
        if rpm is None
        else {"limit": rpm.limit, "remaining": rpm.remaining, "resets_in_s": round(rpm.reset_s, 3)}
    }
    await exchange.json(200, json.dumps(body).encode())


def figures(key: Key, now: datetime) -> dict[str, Any]:
    """The key's usage and budgets now (blocking: the ORM)."""
    stored = ApiKey.objects.select_related("team").filter(pk=key.id).first()
    if stored is None:  # deleted since the route table was read
        raise GatewayError(401, "Incorrect API key provided.", "invalid_api_key")
    day, month = start_of("day", now), start_of("month", now)
    until = now + timedelta(minutes=1)  # the current minute's row included
    team_id = stored.team_id

    def read() -> dict[str, dict[str, Any]]:
        found = {
            "key:day": usage_totals(day, until, key_id=key.id),
            "key:month": usage_totals(month, until, key_id=key.id),
        }
        if team_id is not None:
            found["team:day"] = usage_totals(day, until, team_id=team_id)
            found["team:month"] = usage_totals(month, until, team_id=team_id)
        return found

    def wanted(row: Row) -> bool:
        return row[1] == key.id or (team_id is not None and row[2] == team_id)

    totals, pending = ledger.read_with_unwritten(read, wanted)
    counters = {name: shown(sums) for name, sums in totals.items()}
    for (minute, key_id, row_team, _), values in pending.items():
        for owner, matches in (("key", key_id == key.id), ("team", row_team == team_id)):
            for period, start in (("day", day), ("month", month)):
                if matches and minute >= start.timestamp() and f"{owner}:{period}" in counters:
                    add(counters[f"{owner}:{period}"], values)
    status = []
    live = {owner.kind: owner for owner in key.budget_owners if budgets.live(owner)}
    for kind, obj in (("key", stored), ("team", stored.team)):
        if obj is None:
            continue
        used = used_of(counters, kind, live.get(kind), now)
        for budget in budget_status(obj, used, now=now):
            spent, limit = budget["used"], budget["limit"]
            left = max(0, limit - spent)
            status.append(
                {
                    "owner": kind,
                    **budget,
                    "remaining": round(left, 3) if budget["counts"] == "gpu_seconds" else left,
                    "resets_at": f"{budget['resets_at']:%Y-%m-%dT%H:%M:%SZ}",
                }
            )
    return {
        "object": "usage",
        "key": {
            "name": stored.name,
            "prefix": shown_prefix(stored.prefix),
            "team": stored.team.name if stored.team is not None else None,
        },
        "today": counters["key:day"],
        "this_month": counters["key:month"],
        "budgets": status,
    }


def shown(sums: dict[str, Any]) -> dict[str, Any]:
    return {name: sums[name] for name in SHOWN}


def add(counters: dict[str, Any], values: list[float]) -> None:
    """A row the ledger has not written yet, added to counters read from the table."""
    for name in SHOWN:
        if name in COUNTED:
            counters[name] += values[COUNTED.index(name)]
    counters["requests"] = int(counters["requests"])
    for name in ("tokens_in", "tokens_out", "tokens_cached"):
        counters[name] = int(counters[name])
    counters["tokens"] = counters["tokens_in"] + counters["tokens_out"]
    for name in ("gpu_seconds", "load_gpu_seconds"):
        counters[name] = round(counters[name], 3)


def used_of(
    counters: dict[str, dict[str, Any]], kind: str, live: Owner | None, now: datetime
) -> dict[str, float]:
    """{budget field: used} of the key or its team: the budget check's own figures where this
    process has them live (`live`: the owner as the check knows it), else the counters read
    here."""
    used = {}
    for field, what, period in BUDGETS:
        if live is not None:
            used[field] = budgets.used((live.ref, what, period_id(period, now)))
        else:
            found = counters[f"{kind}:{period}"]
            used[field] = float(sum(found[name] for name in budget_sums(what)))
    return used
