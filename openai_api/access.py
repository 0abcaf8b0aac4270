"""What one gateway request leaves behind: its access log line and its metrics.

The exchange keeps a RequestRecord as its answer goes out (the status, a byte count, when the
first body byte left, the last two body chunks); the handlers add what only they know (the
model, the endpoint, the key). When the request ends, `finish` writes one JSON line
(MSHIP_ACCESS_LOG) and records the request's metrics, once, off the stream.

Token counts come from the answer's usage where the engine reports one: it is in the last
chunk or two of a stream (or at the end of a JSON answer), so only those are searched, never
every chunk.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import re
import sys
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from django.conf import settings

from common import metrics
from openai_api.endpoints import PUBLIC
from openai_api.usage import recording
from openai_api.usage.budgets import budgets
from openai_api.usage.gpu_time import Account, Work

if TYPE_CHECKING:
    from collections.abc import Iterator

    from openai_api.catalog import Key
    from openai_api.usage.budgets import Reservation
    from openai_api.usage.recording import Usage

log = logging.getLogger(__name__)

BATCH = 256  # access lines written at once, at most
CLIENT_GONE = 499
USAGE_TAIL = 4096  # usage sits at the end of an answer: this much of it is searched
TOKENS_IN = re.compile(rb'"(?:prompt_tokens|input_tokens)"\s*:\s*(\d+)')
TOKENS_OUT = re.compile(rb'"(?:completion_tokens|output_tokens)"\s*:\s*(\d+)')
# llama.cpp's timings name its prefix cache's share `cache_n`.
TOKENS_CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens|cache_n)"\s*:\s*(\d+)')
# A transcription's length: verbose_json's duration, or usage {"type": "duration", "seconds"}.
AUDIO_SECONDS = re.compile(rb'"(?:duration|seconds)"\s*:\s*([0-9]+(?:\.[0-9]+)?)')
AUDIO_IN = frozenset({"audio/transcriptions", "audio/translations"})
NAMED = frozenset(
    {
        *PUBLIC,
        "models",
        "responses",
        "responses/input_tokens",
        "responses/compact",
        "conversations",
    }
)


@dataclass(slots=True)
class RequestRecord:
    method: str
    path: str
    request_id: str
    started: float = field(default_factory=time.perf_counter)
    gateway: str = "v1"
    model: str = ""
    endpoint: str = ""
    key: str = ""
    identity: str = ""
    status: int = 0
    bytes_out: int = 0
    first_byte: float | None = None
    waited: str = ""  # "start" (a cold start), "queue" (memory), or "" (neither)
    last: bytes = b""
    before_last: bytes = b""
    # What usage needs (openai_api/usage/): the key, the request's size, its share of its
    # engine's GPU time, the events of a streamed answer (the estimate where no usage comes),
    # usage a stream's engine sent that the client did not ask for (taken out of the answer),
    # and the media units of the request.
    key_ref: Key | None = None
    body_bytes: int = 0
    gpu_seconds: float = 0.0
    streaming: bool = False
    events: int = 0
    reported: tuple[int, int, int] | None = None
    images: int = 0
    characters: int = 0
    trace_id: str = ""  # where tracing is on (common/tracing.py)
    # Of a deployment with several replicas: which took the request, and why
    # (openai_api/routing/).
    replica: int | None = None
    routed_by: str = ""
    # Of a llama.cpp engine whose slots the gateway chooses: what the slot held of its
    # prompt (restored: a cache saved at the engine's last stop; hit; miss).
    cache: str = ""
    # False for work that carries on a request already counted (a background run): its
    # usage counts, not as a request of its own.
    counts_request: bool = True
    # The tokens its budgets hold for it until it ends (openai_api/usage/budgets.py), and
    # whether an engine took it (a caller who leaves before the answer still had its prompt
    # read: that counts).
    reservation: Reservation | None = None
    reached_engine: bool = False
    # The cached tokens an answer reported, read before they were taken out of it
    # (openai_api/cache_figures.py).
    cached_seen: int = 0
    # The tokens its earlier engine calls were metered with (a Responses run's tool turns).
    metered: tuple[int, int] = (0, 0)

    def account(self) -> Account:
        """Whose its GPU time is: its key's, its team's, its deployment's."""
        key = self.key_ref
        return (key.id, key.team_id, self.model) if key is not None else (0, 0, self.model)

    def work(self, began: float) -> Work | None:
        """What its engine call since `began` (perf_counter) did, as the GPU meter weighs it:
        the tokens counted so far less those earlier calls were metered with, and a stream's
        time to its first byte (None: an answer not counted in tokens, charged its time)."""
        if self.endpoint not in recording.TEXT:
            return None
        usage = self.measured(self.status or 200)
        computed = max(0, usage.tokens_in - usage.tokens_cached)
        done_in, done_out = self.metered
        self.metered = (max(computed, done_in), max(usage.tokens_out, done_out))
        first = self.first_byte
        first_s = first - began if self.streaming and first is not None and first > began else None
        return Work(max(0, computed - done_in), max(0, usage.tokens_out - done_out), first_s)

    def sent(self, body: bytes) -> None:
        """A body chunk went out (called per chunk: a few attribute writes, no lock)."""
        if body:
            if self.first_byte is None:
                self.first_byte = time.perf_counter()
            self.bytes_out += len(body)
            self.before_last, self.last = self.last, body
            if self.streaming:
                self.events += body.count(b"data:")

    def measured(self, status: int) -> Usage:
        """What the request used: the engine's own usage where it gave one, else the
        gateway's estimate (counted as one); its GPU time and media units."""
        ok = status < 400
        tail = (self.before_last + self.last)[-USAGE_TAIL:] if ok else b""
        if self.reported is not None:
            usage = recording.Usage(*self.reported)
        elif status == CLIENT_GONE and self.reached_engine and self.endpoint in recording.TEXT:
            # Gone before the first byte: the engine read its prompt all the same.
            prompt, _ = recording.estimate(self.endpoint, self.body_bytes, 0, 0)
            usage = recording.Usage(tokens_in=prompt, estimated=prompt)
        elif not ok:
            usage = recording.Usage()
        else:
            found_in, found_out = token_counts(tail)
            guess_in = guess_out = 0
            if (found_in is None or found_out is None) and self.endpoint in recording.TEXT:
                guess_in, guess_out = recording.estimate(
                    self.endpoint, self.body_bytes, self.events, self.bytes_out
                )
            usage = recording.Usage(
                tokens_in=guess_in if found_in is None else found_in,
                tokens_out=guess_out if found_out is None else found_out,
                tokens_cached=(last_number(TOKENS_CACHED, tail) or 0) if b"cache" in tail else 0,
                estimated=(guess_in if found_in is None else 0)
                + (guess_out if found_out is None else 0),
            )
        usage.gpu_seconds = self.gpu_seconds
        usage.tokens_cached = max(usage.tokens_cached, self.cached_seen)
        if ok:
            usage.images, usage.characters = self.images, self.characters
            if self.endpoint in AUDIO_IN and (seconds := AUDIO_SECONDS.findall(tail)):
                usage.audio_s = float(seconds[-1])
        return usage


def token_counts(tail: bytes) -> tuple[int | None, int | None]:
    """The tokens in and out an answer's tail reports in its last `usage` (None: none)."""
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None, None
    usage = tail[at:]
    return last_number(TOKENS_IN, usage), last_number(TOKENS_OUT, usage)


def last_number(pattern: re.Pattern[bytes], text: bytes) -> int | None:
    found = pattern.findall(text)
    return int(found[-1]) if found else None


def responses_usage(usage: Any) -> tuple[int, int, int] | None:
    """A Responses usage object as a record counts it: tokens in, out and cached."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    figures = (usage.get("input_tokens"), usage.get("output_tokens"), cached or 0)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in figures):
        return None
    return figures  # type: ignore[return-value]


def note_usage(usage: Any) -> None:
    """The usage a response ended with, for the record of the request that ran it: read
    from the response itself, not from the tail of its answer (fields after it can be
    long)."""
    record = current.get()
    if record is not None and (figures := responses_usage(usage)) is not None:
        record.reported = figures


@contextlib.contextmanager
def counted_apart(
    request_id: str,
    *,
    gateway: str,
    like: RequestRecord | None = None,
    counts_request: bool = True,
) -> Iterator[RequestRecord]:
    """Work counted as a request of its own, apart from the HTTP request that carried it (a
    response on a socket's lane, a background run): its record is the current one while the
    block runs (its GPU-seconds, its usage), and it is finished, once, when the block ends.
    `like`: the request whose caller and model it has."""
    record = RequestRecord("POST", "/v1/responses", request_id)
    record.gateway, record.endpoint, record.streaming = gateway, "responses", True
    record.counts_request = counts_request
    if like is not None:
        record.key, record.key_ref, record.identity = like.key, like.key_ref, like.identity
        record.model, record.body_bytes = like.model, like.body_bytes
    token = current.set(record)
    try:
        yield record
    finally:
        current.reset(token)
        try:
            finish(record)
        except Exception:  # accounting never fails the work
            log.exception("could not record request %s", request_id)


# The record of the request the running task serves: the on-demand controller marks on it
# that the request waited for a start or for memory.
current: ContextVar[RequestRecord | None] = ContextVar("modelship_request", default=None)


def mark_waited(why: str) -> None:
    record = current.get()
    if record is not None and not record.waited:
        record.waited = why


def endpoint_label(endpoint: str) -> str:
    """The endpoint as a bounded label: a stored response's id becomes {id}."""
    if endpoint in NAMED:
        return endpoint
    parts = endpoint.split("/")
    if parts[0] == "responses" and len(parts) > 1:
        return "/".join(["responses", "{id}", *parts[2:3]])
    if parts[0] in ("models", "conversations"):
        return parts[0]
    return "other"


def finish(record: RequestRecord) -> None:
    now = time.perf_counter()
    duration = now - record.started
    ttfb = record.first_byte - record.started if record.first_byte is not None else None
    # Nothing went out: the caller left first (nginx's 499).
    status = record.status or CLIENT_GONE
    try:
        used = record.measured(status) if record.model and settings.MSHIP_USAGE_RECORD else None
        if used is not None:
            recording.count(
                record.key_ref,
                record.model,
                status,
                duration,
                ttfb,
                used,
                time.time(),
                request=record.counts_request,
            )
    finally:
        # After its count: between the two it counts twice for a moment, never not at all.
        if record.reservation is not None:
            budgets.release(record.reservation)
    series = _series(record.model, endpoint_label(record.endpoint), status, key_label(record.key))
    series.requests.inc()
    series.duration.observe(duration)
    if ttfb is not None:
        series.ttfb.observe(ttfb)
    if settings.MSHIP_ACCESS_LOG == "json":
        writer.put(line(record, status, duration, ttfb, used))


@dataclass(frozen=True, slots=True)
class Series:
    """One label set's metric children, looked up once (labels() takes a lock and builds
    the key each time)."""

    requests: Any
    duration: Any
    ttfb: Any


def key_label(key: str) -> str:
    """The key label of the request counts: a key's visible prefix only where the site asks
    for it (MSHIP_METRICS_KEY_PREFIXES), since it names the callers to whoever reads /metrics;
    the on-demand gateway's one key (LiteLLM's) is named either way. The access log keeps it."""
    if settings.MSHIP_METRICS_KEY_PREFIXES or key == "ondemand":
        return key
    return ""


@functools.lru_cache(maxsize=4096)
def _series(model: str, endpoint: str, status: int, key: str) -> Series:
    return Series(
        requests=metrics.requests.labels(model, endpoint, str(status), key),
        duration=metrics.request_duration.labels(model, endpoint),
        ttfb=metrics.time_to_first_byte.labels(model, endpoint),
    )


def prepare_series(model: str, endpoint: str) -> None:
    """A model's request and token series at 0 before its first request (status 200, no
    key or team label), so a dashboard draws its line from the start."""
    _series(model, endpoint_label(endpoint), 200, key_label(""))
    recording.prepare_series(model)


def line(
    record: RequestRecord, status: int, duration: float, ttfb: float | None, used: Usage | None
) -> str:
    """The request's access line: one JSON object and its newline, filled into a template
    (a JSON encode of a dict per request cost the gateway more than the rest of its end)."""
    counted = used if status == 200 else None  # an error's tokens are not its answer's
    tokens_in = counted.tokens_in if counted is not None else None
    tokens_out = counted.tokens_out if counted is not None else None
    out = (
        f'{{"time": "{iso_time(time.time())}", "request_id": {text(record.request_id)},'
        f' "gateway": {text(record.gateway)}, "method": {text(record.method)},'
        f' "path": {text(record.path)}, "key": {text(record.key)},'
        f' "identity": {text(record.identity)}, "model": {text(record.model)},'
        f' "endpoint": {text(record.endpoint)}, "status": {status},'
        f' "bytes": {record.bytes_out}, "duration_ms": {round(duration * 1000, 2)},'
        f' "ttfb_ms": {"null" if ttfb is None else round(ttfb * 1000, 2)},'
        f' "waited": {text(record.waited) if record.waited else "null"},'
        f' "tokens_in": {number(tokens_in)}, "tokens_out": {number(tokens_out)}'
    )
    if record.trace_id:
        out += f', "trace_id": {text(record.trace_id)}'
    if record.routed_by:
        out += f', "replica": {number(record.replica)}, "routed_by": {text(record.routed_by)}'
    if record.cache:
        out += f', "cache": {text(record.cache)}'
    if used is not None:
        team = record.key_ref.team_name if record.key_ref is not None else ""
        out += (
            f', "team": {text(team)}, "tokens_cached": {used.tokens_cached},'
            f' "tokens_estimated": {used.estimated},'
            f' "gpu_seconds": {round(used.gpu_seconds, 6)}'
        )
    return out + "}\n"


def text(value: str) -> str:
    """A JSON string: as it is between quotes when nothing in it needs escaping (names,
    ids, most paths), else encoded."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return json.dumps(value)


def number(value: int | None) -> str:
    return "null" if value is None else str(value)


class LineWriter:
    """Access lines are written by a thread of their own, in batches: a request pays for its
    line's template and a deque append, not for a write and flush of stdout each (a slow
    reader of stdout never stalls the gateway), nor for waking the thread (it is woken once
    per batch, when the first line of one arrives)."""

    GATHER_S = 0.02  # once woken, the thread lets a busy gateway's lines gather this long

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.lines: collections.deque[str] = collections.deque()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def put(self, text: str) -> None:
        if self.thread is None:
            self.start()
        self.lines.append(text)
        if not self.wake.is_set():
            self.wake.set()

    def start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self.run, name="modelship-access-log", daemon=True
                )
                self.thread.start()

    def run(self) -> None:
        while True:
            self.wake.wait()
            time.sleep(self.GATHER_S)
            self.wake.clear()  # before draining: a line put from here on wakes it again
            while self.lines:
                batch: list[str] = []
                with contextlib.suppress(IndexError):
                    while len(batch) < BATCH:
                        batch.append(self.lines.popleft())
                self.write(batch)

    def write(self, batch: list[str]) -> None:
        stream = self.stream or sys.stdout
        try:
            stream.write("".join(batch))
            stream.flush()
        except (OSError, ValueError):  # stdout closed: the lines are dropped, not the site
            log.warning("could not write %d access line(s)", len(batch))


_second: tuple[int, str] = (-1, "")


def iso_time(when: float) -> str:
    """`when` as ISO 8601 UTC to the millisecond; the date and time of day are formatted
    once per second, not once per line."""
    global _second
    second = int(when)
    if _second[0] != second:
        _second = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{_second[1]}.{int((when - second) * 1000):03d}+00:00"


writer = LineWriter()
