"""A finished request's usage: its row of the ledger, its budgets' counts, its metrics; and
the budget check of a request that starts. Called once per request, on the event loop: a
few dict lookups and additions; the writing happens on the ledger's and the counters'
threads."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from common import metrics
from openai_api.catalog import Key, catalog
from openai_api.models import shown_prefix
from openai_api.output_tokens import limit_of
from openai_api.usage.budgets import Reservation, budgets
from openai_api.usage.counters import sync
from openai_api.usage.gpu_time import Account, meter
from openai_api.usage.ledger import Row, ledger
from openai_api.usage.models import (
    AUDIO,
    CHARACTERS,
    DURATION,
    ERRORS,
    GPU,
    IMAGES,
    LOAD,
    REQUESTS,
    TOKENS_CACHED,
    TOKENS_ESTIMATED,
    TOKENS_IN,
    TOKENS_OUT,
    TTFT,
    TTFT_COUNT,
)

if TYPE_CHECKING:
    from openai_api.catalog import Route

# Endpoints whose answers are counted in tokens (estimated where the engine reports none).
TEXT = frozenset({"chat/completions", "completions", "responses", "messages", "embeddings"})
CHARS_PER_TOKEN = 4  # the gateway's estimate where an engine reports no usage


async def admit(key: Key | None, tokens: int = 0) -> Reservation | None:
    """A request of `key` may start: 429 when it or its team is out of a budget, or has not
    `tokens` (the most it can spend: `most_tokens`) left; those are held for it until its
    record is finished (openai_api/access.py releases them)."""
    if key is None or not key.budget_owners or not settings.MSHIP_USAGE_RECORD:
        return None
    if sync.thread is None:
        sync.start()
    reservation = budgets.reserve(key.budget_owners, tokens)
    if reservation is not None:
        await budgets.reserve_on_site(reservation)  # every process's holds, where several
    # Counted as it is let in, not at its end: a burst cannot pass requests_per_day.
    budgets.add_request(key.budget_owners)
    return reservation


MAX_COPIES = 128  # `n`: what a reservation multiplies by at most (engines cap it lower)
# The answer-length fields each endpoint's engines read (vLLM's chat takes
# max_completion_tokens first; llama.cpp's n_predict overrides them): the largest counts.
LENGTH_FIELDS = {
    "chat/completions": ("max_tokens", "max_completion_tokens", "n_predict"),
    "completions": ("max_tokens", "n_predict"),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}
RESERVED = TEXT | {"responses/compact"}


def count_of(value: Any) -> int | None:
    """A count as engines read it (vLLM's pydantic takes "64" and 64.0 as 64); None: not
    one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit() and len(value) < 20:
        value = int(value)
    return value if isinstance(value, int) else None


def most_tokens(endpoint: str, route: Route, data: dict[str, Any] | None, body_bytes: int) -> int:
    """The most tokens a request can spend, as its budget reserves it: its prompt (by the
    gateway's estimate from its size, until the engine counts it) and the tokens it may
    generate (the largest length field its engine reads, else the route's limit, which a
    field that is not a positive count also gets) for each of its answers (`n`, `best_of`,
    each prompt of a completions list)."""
    if endpoint not in RESERVED:
        return 0
    prompt = body_bytes // CHARS_PER_TOKEN
    if endpoint == "embeddings" or not isinstance(data, dict):
        return prompt
    limit = limit_of(route)
    lengths = [data[field] for field in LENGTH_FIELDS.get(endpoint, ()) if field in data]
    counted = [count_of(value) for value in lengths]
    if not lengths or any(n is None or n <= 0 for n in counted):
        each = limit
    else:
        each = min(max(n for n in counted if n is not None), limit)
    copies = min(max([1, *(count_of(data.get(f)) or 1 for f in ("n", "best_of"))]), MAX_COPIES)
    prompts = data.get("prompt")
    if endpoint == "completions" and isinstance(prompts, list) and prompts:
        copies *= len(prompts) if not isinstance(prompts[0], int) else 1  # a batch of prompts
    return prompt + each * copies


IMAGE_ENDPOINTS = frozenset({"images/generations", "images/edits", "images/variations"})
MAX_UNITS = 10_000  # a request's own figure is bounded: it is the caller's to set


def media_units(endpoint: str, data: dict[str, Any] | None) -> tuple[int, int]:
    """The images a request asks for and the characters it has spoken, from its body (the
    answer has them too, but a megabyte of images is not read for a count)."""
    if endpoint in IMAGE_ENDPOINTS:
        wanted = (data or {}).get("n", 1)
        if isinstance(wanted, int) and not isinstance(wanted, bool):
            return min(max(wanted, 0), MAX_UNITS), 0
        return 1, 0
    if endpoint == "audio/speech" and isinstance(text := (data or {}).get("input"), str):
        return 0, len(text)
    return 0, 0


@dataclass(slots=True)
class Usage:
    """What one request used, as the ledger adds it up."""

    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    estimated: int = 0  # of tokens_in + tokens_out
    gpu_seconds: float = 0.0
    images: int = 0
    audio_s: float = 0.0
    characters: int = 0


def estimate(endpoint: str, body_bytes: int, events: int, bytes_out: int) -> tuple[int, int]:
    """Tokens in and out by the gateway's own count, where the engine gave none: a token per
    CHARS_PER_TOKEN bytes of the request, a token per streamed event (an engine streams one
    token per event) or per CHARS_PER_TOKEN bytes of a whole answer."""
    tokens_in = body_bytes // CHARS_PER_TOKEN
    if endpoint == "embeddings":
        return tokens_in, 0
    return tokens_in, events if events else bytes_out // CHARS_PER_TOKEN


def count(
    key: Key | None,
    model: str,
    status: int,
    duration: float,
    ttft: float | None,
    usage: Usage,
    when: float,
    *,
    request: bool = True,
) -> None:
    """Add a finished request to its minute's row (only the figures it has: most are 0);
    `request` False: work carrying on a request counted already (its usage only)."""
    row_key = (int(when) // 60 * 60, key.id if key else 0, key.team_id if key else 0, model)
    tokens = usage.tokens_in + usage.tokens_out
    if ledger.thread is None:
        ledger.start()
    with ledger.lock:
        row = ledger.row(row_key)
        if request:
            row[REQUESTS] += 1
            row[DURATION] += duration
            if status >= 400:
                row[ERRORS] += 1
            if ttft is not None:
                row[TTFT] += ttft
                row[TTFT_COUNT] += 1
        if tokens:
            row[TOKENS_IN] += usage.tokens_in
            row[TOKENS_OUT] += usage.tokens_out
            row[TOKENS_CACHED] += usage.tokens_cached
            row[TOKENS_ESTIMATED] += usage.estimated
        if usage.images or usage.audio_s or usage.characters:
            row[IMAGES] += usage.images
            row[AUDIO] += usage.audio_s
            row[CHARACTERS] += usage.characters
        if key is not None:
            seen[key.id] = key  # its team and prefix label its metrics at the flush
            if key.budget_owners:
                # Under the ledger's lock: a flush between the row and the budget's count
                # would take it out of the count before it was in.
                budgets.add(key.budget_owners, tokens, 0.0)


def book_gpu(account: Account, minute: int, seconds: float) -> None:
    """GPU-seconds the meter divided to a request in a minute (openai_api/usage/gpu_time.py),
    added to its key's row of that minute and to its key's and team's budgets: in the
    process whose meter divided them (the site scheduler's owner, where there is one)."""
    book(account, minute, seconds, GPU, budgeted=True)


meter.book = book_gpu


def book_load(account: Account, minute: int, seconds: float) -> None:
    """A part of a start's or a wake's GPU-seconds that a key's request waited for: in its
    row (an attribution of the deployment's load account) and, where
    MSHIP_USAGE_BUDGET_LOADS is on, in its key's and team's GPU-second budgets."""
    book(account, minute, seconds, LOAD, budgeted=settings.MSHIP_USAGE_BUDGET_LOADS)


def book(account: Account, minute: int, seconds: float, column: int, *, budgeted: bool) -> None:
    """GPU-seconds added to `column` of the account's row of the minute (its team the key's,
    as the route table has it, whatever was said) and, `budgeted`, to its key's and team's
    GPU-second budgets."""
    key_id, team_id, model = account
    key = key_by_id(key_id) if key_id else None
    if key is not None:
        team_id = key.team_id
    owners = key.budget_owners if key is not None and budgeted else ()
    if ledger.thread is None:
        ledger.start()
    with ledger.lock:
        ledger.row((minute, key_id, team_id, model))[column] += seconds
        if key is not None:
            seen[key.id] = key
        if owners:
            budgets.watch(owners)
            budgets.add(owners, 0, seconds)
    if owners and sync.thread is None:
        sync.start()  # the owner's process admits no request: its counts go out from here


_keys: tuple[object, dict[int, Key]] = (None, {})


def key_by_id(key_id: int) -> Key | None:
    """The key of this id in the route table (None: gone since)."""
    global _keys  # one map per route table, made again when it changes
    snapshot = catalog.snapshot
    if snapshot is None:
        return None
    if _keys[0] is not snapshot:
        _keys = (snapshot, {key.id: key for key in snapshot.keys.values()})
    return _keys[1].get(key_id)


# The keys whose usage is in the ledger, by id (bounded by the keys there are).
seen: dict[int, Key] = {}


def count_metrics(rows: dict[Row, list[float]]) -> None:
    """The tokens and GPU-seconds of rows the ledger flushes, added to the metrics: once per
    row and flush, not once per request (they lag by up to MSHIP_USAGE_FLUSH_S)."""
    for (_, key_id, _, model), values in rows.items():
        key = seen.get(key_id)
        series = _series(model, key.team_name if key else "", _key_label(key))
        if values[TOKENS_IN]:
            series[0].inc(values[TOKENS_IN])
        if values[TOKENS_OUT]:
            series[1].inc(values[TOKENS_OUT])
        if values[GPU]:
            series[2].inc(values[GPU])
        if values[TOKENS_CACHED]:
            series[3].inc(values[TOKENS_CACHED])


ledger.on_swap.append(count_metrics)


def prepare_series(model: str) -> None:
    """The model's token series (no team, no key) at 0, before any request."""
    _series(model, "", "")


def _key_label(key: Key | None) -> str:
    if key is None or not settings.MSHIP_METRICS_KEY_PREFIXES:
        return ""
    return shown_prefix(key.prefix)


@functools.lru_cache(maxsize=4096)
def _series(model: str, team: str, key: str) -> tuple[Any, Any, Any, Any]:
    return (
        metrics.tokens.labels(model, "in", team, key),
        metrics.tokens.labels(model, "out", team, key),
        metrics.gpu_seconds.labels(model, team, key),
        metrics.tokens.labels(model, "cached", team, key),
    )
