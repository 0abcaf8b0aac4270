"""The gateway's in-memory view of deployments and API keys.

A request never queries the database: it reads the current snapshot. A background task
asks every MSHIP_ROUTE_REFRESH_S whether either table changed (one aggregate query per
table, common/versioned.py) and only then reads both again (one query each) and swaps the
snapshot whole, so a request sees one consistent view. It reads them anyway every
FULL_READ_S, for a write that went around the ORM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import DatabaseError

from common import metrics
from common.db_thread import DatabaseThread
from common.versioned import Stamp, stamp
from deployments import engine_secrets, kv_store
from deployments.adapters import RUNTIME_ADAPTERS, lora_files
from deployments.loaders import LOADERS, EngineSpec
from deployments.loaders.base import whole_number
from deployments.loaders.defaults import UNKNOWN, RequestDefaults
from deployments.loaders.vllm import DEFAULT_MAX_LORAS
from deployments.models import Deployment, ResponsesBy
from openai_api.errors import GatewayError
from openai_api.models import ApiKey
from openai_api.usage.budgets import Owner
from openai_api.usage.gpu_share import replica_shares
from openai_api.usage.models import BUDGETS, Budgeted, Team

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    deployment_id: int
    name: str
    aliases: tuple[str, ...]
    loader: str
    usecase: str
    endpoints: frozenset[str]
    state: str
    on_demand: bool
    urls: tuple[str, ...]
    created: int
    idle_timeout_s: float = 600.0
    system: bool = False
    networks: tuple[str, ...] = ()  # the engines' Docker networks (subnets)
    sees_images: bool = False  # its chat takes image parts
    reads_files: bool = False  # its chat takes file parts (a PDF, as OpenAI's do)
    responses_by_engine: bool = False  # /v1/responses passed to the engine's own
    # The most tokens a request may ask for (Loader.output_token_limit); None: the site's
    # MSHIP_MAX_OUTPUT_TOKENS.
    max_output_tokens: int | None = None
    # What its engine makes a request with where the request sets nothing (sampling, answer
    # length: Loader.request_defaults); a Responses object reports them.
    defaults: RequestDefaults = UNKNOWN
    # Its chat takes a forced function by name (Loader.names_forced_tool).
    names_forced_tool: bool = True
    priority: int = 0  # its class (common/priority.py)
    max_concurrency: int | None = None  # requests at once, on the site
    # Its engine orders requests by a priority each carries (engine_dialect.with_priority).
    engine_priority: bool = False
    # Each replica's GPU share, in the order of `urls` (openai_api/usage/gpu_share.py).
    gpu_shares: tuple[float, ...] = ()
    adapter: Adapter | None = None  # a LoRA adapter served from its base's engines
    # Per engine URL, the adapters its engine loaded when it started (llama.cpp's --lora
    # list, in order): a request for an adapter names its place in its engine's own list.
    loras: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Requests its engine serves at once (the replica choice's load floor), the slots the
    # gateway pins its requests to (0: none), whether their caches are saved at a stop
    # and restored after, and whether one is copied into another slot (openai_api/routing/,
    # deployments/kv_store.py).
    batch: int = 1
    slots: int = 0
    keeps_cache: bool = False
    copies_slots: bool = False


@dataclass(frozen=True)
class Adapter:
    base: str  # the base deployment's name
    runtime: bool = False  # vLLM: loaded into a running engine on first use
    path: str = ""  # its files, where the engine reads them
    slots: int = 1  # adapters one replica holds at once (vLLM's max_loras)


@dataclass(frozen=True)
class Key:
    id: int
    name: str
    prefix: str
    secret_hash: str
    revoked: bool
    allowed_models: frozenset[str]
    requests_per_minute: int | None
    priority: int = 0
    max_concurrency: int | None = None
    team_id: int = 0
    team_name: str = ""
    # The key's and its team's budgets, where they set any (openai_api/usage/budgets.py).
    budget_owners: tuple[Owner, ...] = ()

    def may_use(self, route: Route) -> bool:
        if not self.allowed_models:
            return True
        return bool(self.allowed_models & {route.name, *route.aliases})


@dataclass(frozen=True)
class Snapshot:
    routes: dict[str, Route] = field(default_factory=dict)  # served name or alias -> route
    models: tuple[Route, ...] = ()
    keys: dict[str, Key] = field(default_factory=dict)  # prefix -> key
    loaded_at: float = 0.0  # when the tables were last seen to hold this (monotonic)
    stamp: tuple[Stamp, ...] = ()  # the tables' stamps when read
    read_at: float = 0.0  # when the rows were read (monotonic)
    # Every engine URL of every deployment, with its replica's secret ("" for none): what the
    # forwarder sends it (deployments/engine_secrets.py). Kept off Route, which is logged.
    engine_secrets: dict[str, str] = field(default_factory=dict, repr=False)

    def by_id(self, deployment_id: int) -> Route | None:
        """The deployment's own route (its adapters' routes share its id: its engines)."""
        found = (r for r in self.models if r.deployment_id == deployment_id and not r.adapter)
        return next(found, None)


def route_of(d: Deployment) -> Route:
    if d.adapter_of is not None:
        return adapter_route(d, d.adapter_of)
    loader = LOADERS.get(d.loader)
    spec = EngineSpec.of(d)
    endpoints = loader.endpoints(spec) if loader else ()
    handles = (d.runtime_handle or {}).get("replicas", [])
    return Route(
        deployment_id=d.pk,
        name=d.name,
        aliases=tuple(str(a) for a in (d.aliases or ())),
        loader=d.loader,
        usecase=d.usecase,
        endpoints=frozenset(endpoints),
        state=d.state,
        on_demand=d.is_on_demand,
        urls=tuple(str(u) for u in (d.engine_urls or ())),
        created=int(d.created.timestamp()),
        idle_timeout_s=float(d.effective_idle_timeout_s),
        system=d.system,
        networks=tuple(str(subnet) for h in handles for subnet in h.get("subnets", ())),
        sees_images=loader.sees_images(spec) if loader else False,
        reads_files=loader.reads_files(spec) if loader else False,
        responses_by_engine=d.responses == ResponsesBy.ENGINE,
        max_output_tokens=loader.output_token_limit(spec) if loader else None,
        defaults=loader.request_defaults(spec) if loader else UNKNOWN,
        names_forced_tool=loader.names_forced_tool if loader else True,
        priority=d.priority,
        max_concurrency=d.max_concurrency,
        engine_priority=loader.schedules_by_priority(spec) if loader else False,
        gpu_shares=replica_shares(d, len(d.engine_urls or ())),
        batch=loader.batch_size(spec) if loader else 1,
        slots=loader.pinned_slots(spec) if loader else 0,
        keeps_cache=kv_store.keeps(d),
        copies_slots=kv_store.copies(d, loader.pinned_slots(spec)) if loader else False,
        loras=tuple(
            (str(h.get("url", "")), tuple(str(n) for n in h.get("adapters", ())))
            for h in handles
            if h.get("adapters")
        ),
    )


def adapter_route(adapter: Deployment, base: Deployment) -> Route:
    """An adapter's route: its names, its base's engines, state and queue; its place in the
    list of adapters the base's engine loads when it starts. While a running base loaded
    another list (it started before the adapter was added, and is being replaced), the
    adapter is not ready: a place in one list is another adapter in the other."""
    route = route_of(base)
    files = dict(lora_files(base))
    handles = (base.runtime_handle or {}).get("replicas", [])
    state = route.state
    if base.loader in RUNTIME_ADAPTERS:  # loaded on first use, by a base started for them
        path = files.get(adapter.name, "")
        ready = bool(path) and (not handles or all(h.get("lora") for h in handles))
        slots = whole_number(base.config.get("max_loras")) or DEFAULT_MAX_LORAS
        found = Adapter(base=base.name, runtime=True, path=path, slots=slots)
    else:
        # Its place is its engine's: read as the request is sent (engine_dialect.with_lora).
        loaded = [adapter.name in h.get("adapters", ()) for h in handles]
        ready = adapter.name in files and all(loaded)
        found = Adapter(base=base.name)
    if not ready and state == "ready":
        state = "starting"  # its base's replacement loads it
    return replace(
        route,
        name=adapter.name,
        aliases=tuple(str(a) for a in (adapter.aliases or ())),
        state=state,
        created=int(adapter.created.timestamp()),
        adapter=found,
        keeps_cache=False,  # its requests share its base's slots; the base's stop saves them
        copies_slots=False,
    )


def key_of(k: ApiKey) -> Key:
    allowed = k.allowed_models or []
    if not isinstance(allowed, list) or not all(isinstance(m, str) for m in allowed):
        raise TypeError("allowed_models is not a list of names")
    owners = tuple(
        Owner(kind, owner.pk, ref, owner.name, limits)
        for kind, owner, ref in (
            ("key", k, k.prefix),
            ("team", k.team, getattr(k.team, "ref", "")),
        )
        if owner is not None and (limits := budget_limits(owner))
    )
    # A budgeted key runs so many requests at once at most where it sets no cap of its own:
    # each holds its reservation, and a burst cannot take every engine's slots.
    budget_cap = int(settings.MSHIP_BUDGET_MAX_CONCURRENCY) if owners else 0
    return Key(
        id=k.pk,
        name=k.name,
        prefix=k.prefix,
        secret_hash=k.secret_hash,
        revoked=k.revoked,
        allowed_models=frozenset(allowed),
        requests_per_minute=k.requests_per_minute,
        priority=k.priority,
        max_concurrency=k.max_concurrency or budget_cap or None,
        team_id=k.team_id or 0,
        team_name=k.team.name if k.team is not None else "",
        budget_owners=owners,
    )


def budget_limits(owner: Budgeted) -> tuple[tuple[str, str, str, int], ...]:
    return tuple(
        (field, what, period, limit)
        for field, what, period in BUDGETS
        if (limit := getattr(owner, field)) is not None
    )


_reported: set[tuple[str, int, str]] = set()


def skipped(kind: str, pk: int, exc: Exception) -> None:
    """A row that cannot become a route or a key is left out (a key left out fails closed),
    and said once per row and problem, not at every reload."""
    report = (kind, pk, repr(exc))
    if report not in _reported:
        _reported.add(report)
        log.error("the %s row %s cannot be loaded, left out of the route table: %r", kind, pk, exc)


FULL_READ_S = 10.0


def stamps() -> tuple[Stamp, Stamp, Stamp]:
    """The deployments', the keys' and the teams' stamps."""
    return stamp(Deployment), stamp(ApiKey), stamp(Team)


def load() -> Snapshot:
    routes: dict[str, Route] = {}
    models = []
    keys: dict[str, Key] = {}
    # Before the rows: a write between the two reads moves the stamp again, and the
    # next check reads the rows again.
    seen = stamps()
    secrets: dict[str, str] = {}
    for d in Deployment.objects.select_related("adapter_of").order_by("name"):
        try:
            route = route_of(d)
            # An adapter's row lists its base's URLs and holds no handle: never its "".
            known = engine_secrets.by_url((d.runtime_handle or {}).get("replicas", []))
            for url in (*route.urls, *known):
                secrets[url] = known.get(url) or secrets.get(url, "")
        except Exception as exc:  # one bad row must not take the others down
            skipped("deployment", d.pk, exc)
            continue
        models.append(route)
        for served in (route.name, *route.aliases):
            routes.setdefault(served, route)
    for k in ApiKey.objects.select_related("team"):
        try:
            keys[k.prefix] = key_of(k)
        except Exception as exc:
            skipped("API key", k.pk, exc)
    metrics.route_table_loaded().set(time.time())
    now = time.monotonic()
    return Snapshot(
        routes=routes,
        models=tuple(models),
        keys=keys,
        loaded_at=now,
        stamp=seen,
        read_at=now,
        engine_secrets=secrets,
    )


def states(snapshot: Snapshot) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {r.deployment_id: (r.state, r.urls) for r in snapshot.models if r.adapter is None}


class Catalog:
    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        # Its reads keep one connection: a check twice a second is not a new one each time.
        self._db = DatabaseThread("modelship-route-table")
        # Loaded by `warm` at the start: the first request reads the tables again itself.
        self._reread = False
        # Called when a reload shows a deployment's state changed (the on-demand controller
        # wakes its waiters on it).
        self.listeners: list[Callable[[], None]] = []
        # Engine URLs a reload did not find either, by the table that was read then.
        self._strangers: tuple[Snapshot | None, set[str]] = (None, set())
        self._learning: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    async def current(self) -> Snapshot:
        """The route table; 503 when it cannot be loaded or is older than
        MSHIP_ROUTE_STALE_S (the database stopped answering): keys fail closed, a revoked
        key is never honoured from an old table."""
        if self.snapshot is None or self._reread:
            if self._first is None:
                self._first = asyncio.Lock()
            async with self._first:
                if self.snapshot is None or self._reread:
                    try:
                        self.snapshot = await self._db.run(load)
                        self._reread = False
                    except DatabaseError as exc:
                        if self.snapshot is None:
                            raise GatewayError(
                                503,
                                f"The route table cannot be loaded ({exc.__class__.__name__}).",
                                "route_table_unavailable",
                                {"retry-after": "5"},
                            ) from exc
                        # The table the start loaded stands (its age still bounds it); the
                        # refresher keeps trying.
                        self._reread = False
        if self._task is None or self._task.done():
            self.loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._refresh())
        age = time.monotonic() - self.snapshot.loaded_at
        if age > settings.MSHIP_ROUTE_STALE_S:
            raise GatewayError(
                503,
                f"The route table is {age:.0f} s old: the database does not answer, so keys"
                " and routes cannot be checked.",
                "route_table_stale",
                {"retry-after": "5"},
            )
        return self.snapshot

    async def warm(self) -> None:
        """The gateway's start: the table loaded and its refresher running, so its age is
        known (and kept current) before any request. The first request still reads the
        tables itself, as it did with nothing loaded: what was made between the start and
        it (the key `serve` makes once its gateway runs) is not left to the next refresh."""
        await self.current()
        self._reread = True

    async def engine_secret(self, url: str) -> str:
        """The secret of the engine at `url` (its replica's: deployments/engine_secrets.py),
        "" for an engine started without one. An engine the table does not list yet (its
        start, which the site's scheduler saw first, ended since the last reload) makes it
        read the tables once: a burst of requests to it waits for one read; a URL that
        read did not find either is not read for again until the table changes."""
        snapshot = self.snapshot
        if snapshot is None:
            return ""
        secret = snapshot.engine_secrets.get(url)
        if secret is not None:
            return secret
        if self._strangers[0] is snapshot and url in self._strangers[1]:
            return ""
        loop = asyncio.get_running_loop()
        if self._learning is None or self._learning[0] is not loop:
            self._learning = (loop, asyncio.Lock())
        async with self._learning[1]:
            if self.snapshot is snapshot:  # no reload while it waited
                await self._reload()
        snapshot = self.snapshot
        if snapshot is None:
            return ""
        secret = snapshot.engine_secrets.get(url)
        if secret is None:
            if self._strangers[0] is not snapshot:
                self._strangers = (snapshot, set())
            self._strangers[1].add(url)
        return secret or ""

    async def _reload(self) -> None:
        before = self.snapshot
        try:
            self.snapshot = await self._db.run(load)
        except DatabaseError:
            log.exception("could not read the route table for an engine's secret")
            return
        if before is None or states(before) != states(self.snapshot):
            for listener in list(self.listeners):
                listener()

    def request_refresh(self) -> None:
        """Reload soon rather than at the next interval (callable from any thread)."""
        if self.loop is not None and self._wake is not None:
            self.loop.call_soon_threadsafe(self._wake.set)

    async def _refresh(self) -> None:
        try:
            await self._refresh_until_cancelled()
        finally:
            # The loop's end (or a test's cancel): its connection closed with it, not left
            # to the thread's idle timeout.
            self._db.release()

    async def _refresh_until_cancelled(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), settings.MSHIP_ROUTE_REFRESH_S)
            asked = self._wake.is_set()
            self._wake.clear()
            try:
                before = self.snapshot
                if not asked and await self._unchanged(before):
                    continue
                self.snapshot = await self._db.run(load)
                if before is None or states(before) != states(self.snapshot):
                    for listener in list(self.listeners):
                        listener()
            except Exception:  # a database hiccup keeps the last good view
                log.exception("could not refresh the route table")

    async def _unchanged(self, snapshot: Snapshot | None) -> bool:
        """Whether the tables still hold what `snapshot` was read from (then it is marked
        current, as a reload would have); never for one read FULL_READ_S ago or more."""
        if snapshot is None or time.monotonic() - snapshot.read_at >= FULL_READ_S:
            return False
        checked = time.monotonic()
        if await self._db.run(stamps) != snapshot.stamp:
            return False
        if self.snapshot is snapshot:
            self.snapshot = replace(snapshot, loaded_at=checked)
            metrics.route_table_loaded().set(time.time())
        return True


catalog = Catalog()
