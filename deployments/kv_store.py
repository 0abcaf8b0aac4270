"""llama.cpp slots' KV caches kept on disk across a stop (issue 61, "The cache survives a
swap").

An on-demand llama.cpp engine is started with `--slot-save-path` in a folder of its
deployment's under VAR_DIR/kv (0700). As it stops (idle, make-room, an operator's stop,
`serve`'s end), every slot whose conversation is worth keeping (MSHIP_KV_KEEP_MIN_TOKENS or
more, its last request ended within MSHIP_KV_KEEP_RECENT_S) is saved there
(`POST /slots/{id}?action=save`), with the block hashes the gateway last sent it
(openai_api/routing/slots.py writes them to the replica's ledger): the first request after a
start that continues one of them has it restored into its slot before it is sent
(openai_api/routing/kv_restore.py), and the file is let go; the next stop saves it anew.

Bounded and kept apart: the site's saved caches take at most MSHIP_KV_KEEP_BYTES (the oldest
deleted first) and none lives past MSHIP_KV_KEEP_MAX_AGE_S; a folder's caches belong to one
identity of its model (the file's path, size and time, the engine's configuration, its
adapters) and are deleted when that changes, so none is ever restored into another model;
the block hashes are seeded with the tenant's scope, so a cache is restored only for a
request of the tenant that made it; files are 0600.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
from django.conf import settings

from common import metrics
from common.chains import shared_run
from deployments import engine_secrets

if TYPE_CHECKING:
    from collections.abc import Iterator

    from deployments.models import Deployment

log = logging.getLogger(__name__)
INDEX: Final = "index.json"
LOCK: Final = ".lock"
SAVE_TIMEOUT_S: Final = 10.0
# The whole save at a stop: what is not saved by then is let go (a stop is not held up).
SAVE_DEADLINE_S: Final = 5.0
MAX_ENTRIES: Final = 4096  # per deployment
REMOVED: Final = "removed"  # a deletion's stop (deployments/tasks.py): nothing to keep
FILE: Final = re.compile(r"[0-9a-f]{16}\.bin")
# A slot's cache on its way to another slot (openai_api/routing/slot_copy.py): deleted once
# restored; one a crash left is deleted at the next start, past COPY_LEFT_S.
COPY_SUFFIX: Final = ".copy"
COPY_LEFT_S: Final = 60.0


@dataclass
class Entry:
    file: str  # a name in the folder: 16 hex digits and .bin, made here
    blocks: list[int]  # the conversation's chained block hashes (tenant-seeded)
    tokens: int
    bytes: int
    saved_at: float  # wall time
    mark: int = 0  # the conversation's last request, hashed (openai_api/routing/blocks.py)


@dataclass
class Index:
    identity: str = ""
    entries: list[Entry] = field(default_factory=list)


def root() -> Path:
    return Path(settings.VAR_DIR) / "kv"


def folder(name: str) -> Path:
    """A deployment's folder (by a digest of its name: no name is ever a path)."""
    return root() / hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


def keeps(deployment: Deployment) -> bool:
    """Whether its slots' caches are kept across a stop: an on-demand llama.cpp chat model
    run as a process on this host (a container or a Ray node does not see this folder)."""
    return deployment.is_on_demand and saves_slots(deployment)


def copies(deployment: Deployment, slots: int) -> bool:
    """Whether a free slot of one of its replicas is given another's cache of a shared prefix
    (openai_api/routing/slot_copy.py): a llama.cpp chat model as `keeps` says, with `slots`
    (those the gateway pins its requests to) to copy among, always-on or on-demand."""
    return settings.MSHIP_SLOT_COPY_MIN_BLOCKS > 0 and slots > 1 and saves_slots(deployment)


def saves_slots(deployment: Deployment) -> bool:
    """A llama.cpp chat model run as a process on this host (a container or a Ray node does
    not see the folder its slots are saved in), where the site lets caches touch the disk."""
    from deployments.models import Runtime  # noqa: PLC0415 - models import this module's users

    return (
        settings.MSHIP_KV_KEEP_BYTES > 0
        and deployment.loader == "llama_server"
        and deployment.usecase == "generate"
        and deployment.runtime == Runtime.PROCESS
        and deployment.adapter_of_id is None
        # llama.cpp saves no slot of a model that reads images (its projector's state).
        and "mmproj" not in (deployment.config or {})
    )


def identity(deployment: Deployment, adapters: tuple[str, ...] = ()) -> str:
    """What a saved cache belongs to: the model's file as it is, the engine's settings."""
    from deployments.store.refs import resolved_or_same  # noqa: PLC0415 - refs reads Deployment

    model = resolved_or_same(deployment.model)
    try:
        found = os.stat(model)
        stamp = [os.path.realpath(model), found.st_size, found.st_mtime_ns]
    except OSError:
        stamp = [model]
    said = {"model": stamp, "config": deployment.config or {}, "adapters": list(adapters)}
    text = json.dumps(said, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@contextlib.contextmanager
def locked(where: Path) -> Iterator[Index]:
    """The folder's index under its lock, written back as the block ends."""
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(where / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = read_index(where)
        before = asdict(index)
        yield index
        if asdict(index) != before:
            write_index(where, index)


def read_index(where: Path) -> Index:
    try:
        said = json.loads((where / INDEX).read_text())
        entries = [Entry(**e) for e in said.get("entries", [])]
        # Only names made here: an index edited by hand names no other file to delete.
        entries = [e for e in entries if isinstance(e.file, str) and FILE.fullmatch(e.file)]
        return Index(str(said.get("identity", "")), entries)
    except (OSError, ValueError, TypeError, AttributeError):
        return Index()  # none, or not ours to read: its files are swept as strays


def write_index(where: Path, index: Index) -> None:
    temporary = where / f".{INDEX}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(index), out)
    os.replace(temporary, where / INDEX)


def drop(where: Path, index: Index, entry: Entry) -> None:
    with contextlib.suppress(ValueError):
        index.entries.remove(entry)
    with contextlib.suppress(OSError):
        (where / entry.file).unlink()


def prepare(deployment: Deployment, adapters: tuple[str, ...] = ()) -> Path:
    """The folder an engine about to start saves into (with a separator at its end, as
    llama.cpp wants it): its caches kept where the model is the same, else deleted."""
    where = folder(deployment.name)
    with locked(where) as index:
        now = identity(deployment, adapters)
        if index.identity != now:
            for entry in list(index.entries):
                drop(where, index, entry)
            index.identity = now
        sweep(where, index)
        for ledger in where.glob("ledger-*.json"):  # of engines gone: this one starts anew
            with contextlib.suppress(OSError):
                ledger.unlink()
        # A copy in flight belongs to another replica still running (a replica replaced).
        left = time.time() - COPY_LEFT_S
        for copy in where.glob(f"*{COPY_SUFFIX}"):
            with contextlib.suppress(OSError):
                if copy.stat().st_mtime < left:
                    copy.unlink()
    return where


def purge(name: str) -> None:
    """A deployment deleted: its saved caches go with it."""
    where = folder(name)
    if where.is_dir():
        with locked(where) as index:
            for entry in list(index.entries):
                drop(where, index, entry)
            sweep(where, index)
            for copy in where.glob(f"*{COPY_SUFFIX}"):
                with contextlib.suppress(OSError):
                    copy.unlink()


def sweep(where: Path, index: Index) -> None:
    """Entries too old, or whose file is gone, go; files no entry names go."""
    oldest = time.time() - settings.MSHIP_KV_KEEP_MAX_AGE_S
    for entry in list(index.entries):
        if entry.saved_at < oldest or not (where / entry.file).is_file():
            drop(where, index, entry)
    named = {entry.file for entry in index.entries}
    for path in where.glob("*.bin"):
        if path.name not in named:
            with contextlib.suppress(OSError):
                path.unlink()


def ledger_path(where: Path, url: str) -> Path:
    return where / f"ledger-{hashlib.blake2b(url.encode(), digest_size=6).hexdigest()}.json"


def write_ledger(where: Path, url: str, said: dict[str, Any]) -> None:
    """A replica's slots as the gateway last left them (openai_api/routing/slots.py)."""
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = ledger_path(where, url)
    temporary = path.with_suffix(f".{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(said, out)
    os.replace(temporary, path)


def read_ledger(where: Path, url: str) -> list[dict[str, Any]]:
    try:
        said = json.loads(ledger_path(where, url).read_text())
        slots = said.get("slots") if isinstance(said, dict) else None
        return [s if isinstance(s, dict) else {} for s in slots] if isinstance(slots, list) else []
    except (OSError, ValueError):
        return []


def save(deployment: Deployment, reason: str = "") -> int:
    """Before its engines stop: the slots worth keeping saved (count), within
    SAVE_DEADLINE_S and the site's budget. Never raises: a cache not saved is a cache
    recomputed, and the stop goes on."""
    if not keeps(deployment) or reason == REMOVED:
        return 0
    try:
        return save_all(deployment)
    except Exception:
        log.exception("%s: slot caches not saved", deployment.name)
        return 0


def save_all(deployment: Deployment) -> int:
    began, saved = time.monotonic(), 0
    where = folder(deployment.name)
    try:
        with (
            httpx.Client(timeout=SAVE_TIMEOUT_S, auth=engine_secrets.auth(deployment)) as client,
            locked(where) as index,
        ):
            for url in deployment.engine_urls or ():
                if time.monotonic() - began > SAVE_DEADLINE_S:
                    break
                saved += save_replica(client, where, index, str(url), began, deployment.name)
            sweep(where, index)
            for entry in index.entries[:-MAX_ENTRIES]:
                drop(where, index, entry)
            metrics.kv_saved_bytes.labels(deployment.name).set(sum(e.bytes for e in index.entries))
    except OSError as exc:
        log.warning("%s: slot caches not saved: %s", deployment.name, exc)
    within_budget()
    if saved:
        took = time.monotonic() - began
        log.info("%s: saved %d slot cache(s) in %.3f s", deployment.name, saved, took)
    return saved


def save_replica(
    client: httpx.Client, where: Path, index: Index, url: str, began: float, name: str
) -> int:
    ledger = read_ledger(where, url)
    with contextlib.suppress(OSError):
        ledger_path(where, url).unlink()
    try:
        answer = client.get(url + "/slots")
        answer.raise_for_status()
        slots = answer.json()
    except (httpx.HTTPError, ValueError):
        return 0
    recent = time.time() - settings.MSHIP_KV_KEEP_RECENT_S
    saved = 0
    budget = settings.MSHIP_KV_KEEP_BYTES - site_bytes()
    for slot in slots if isinstance(slots, list) else []:
        if time.monotonic() - began > SAVE_DEADLINE_S or budget <= 0:
            break  # past the budget, what is saved next only makes older ones go
        number = slot.get("id") if isinstance(slot, dict) else None
        if type(number) is not int or not 0 <= number < len(ledger):
            continue
        blocks = worth_keeping(ledger[number], slot, recent)
        if blocks is None:
            continue
        mark = ledger[number].get("mark")
        file = f"{secrets.token_hex(8)}.bin"
        try:
            answer = client.post(f"{url}/slots/{number}?action=save", json={"filename": file})
            answer.raise_for_status()
            os.chmod(where / file, 0o600)
            size = (where / file).stat().st_size
            budget -= size
        except (httpx.HTTPError, OSError) as exc:
            log.warning("slot %s of %s not saved: %s", number, url, exc)
            with contextlib.suppress(OSError):
                (where / file).unlink()
            continue
        tokens, now = slot["n_prompt_tokens"], time.time()
        index.entries.append(
            Entry(file, blocks, tokens, size, now, mark if type(mark) is int else 0)
        )
        metrics.kv_saves.labels(name).inc()
        saved += 1
    return saved


def worth_keeping(said: dict[str, Any], slot: dict[str, Any], recent: float) -> list[int] | None:
    """A slot's blocks where its conversation is worth saving: its last request ended (the
    engine holds that prompt and its answer), recently, with MSHIP_KV_KEEP_MIN_TOKENS or
    more, and nothing runs on it now."""
    blocks, tokens, used = said.get("blocks"), slot.get("n_prompt_tokens"), said.get("used")
    if said.get("done") is not True or slot.get("is_processing"):
        return None
    if not isinstance(blocks, list) or not blocks or not all(type(b) is int for b in blocks):
        return None
    if not isinstance(used, int | float) or used < recent:
        return None
    if type(tokens) is not int or tokens < settings.MSHIP_KV_KEEP_MIN_TOKENS:
        return None
    return blocks


def site_bytes() -> int:
    folders = [p for p in root().glob("*") if p.is_dir()] if root().is_dir() else []
    return sum(e.bytes for where in folders for e in read_index(where).entries)


def within_budget() -> None:
    """The site's saved caches within MSHIP_KV_KEEP_BYTES, the oldest deleted first."""
    folders = [p for p in root().glob("*") if p.is_dir()] if root().is_dir() else []
    found: list[tuple[float, Path, str, int]] = []
    for where in folders:
        for entry in read_index(where).entries:
            found.append((entry.saved_at, where, entry.file, entry.bytes))
    total = sum(size for *_, size in found)
    budget = settings.MSHIP_KV_KEEP_BYTES
    for _, where, name, size in sorted(found):
        if total <= budget:
            break
        with locked(where) as index:
            for entry in index.entries:
                if entry.file == name:
                    drop(where, index, entry)
                    break
        total -= size


def take(
    name: str, blocks: list[int], marks: list[int], held: tuple[int, bool]
) -> tuple[Entry | None, int]:
    """The saved cache that holds the most of a request (the longest run of its blocks, then
    an earlier request of its conversation), where it holds more than `held` (the slot's
    run, and whether the slot holds the conversation), taken out of the index (its file
    stays until `let_go`, once restored); and how many are left."""
    where = folder(name)
    if not (where / INDEX).is_file():
        return None, 0
    seen = set(marks)
    with locked(where) as index:
        best, most = None, held
        for entry in index.entries:
            found = worth_restoring(entry, blocks, seen)
            if found is not None and found > most:
                best, most = entry, found
        if best is not None:
            index.entries.remove(best)
        return best, len(index.entries)


def worth_restoring(entry: Entry, blocks: list[int], marks: set[int]) -> tuple[int, bool] | None:
    """What a saved cache holds of a request (its run of blocks, whether it is an earlier
    state of the request's conversation), where it is worth restoring: that conversation's,
    or one whose every block the request begins with (a shared prompt and nothing more).
    Another conversation under the same system prompt is not taken from its owner."""
    run = shared_run(entry.blocks, blocks)
    same = bool(entry.mark) and entry.mark in marks
    if not run or not (same or run == len(entry.blocks)):
        return None
    return run, same


def let_go(name: str, entry: Entry) -> None:
    with contextlib.suppress(OSError):
        (folder(name) / entry.file).unlink()


def held(name: str) -> tuple[int, int]:
    """A deployment's saved caches: how many, how many bytes."""
    entries = read_index(folder(name)).entries
    return len(entries), sum(e.bytes for e in entries)
