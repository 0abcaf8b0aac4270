"""The replica choice with its state: the loads it weighs (this process's outstanding
requests, plus the other processes' where Redis shares them), the block tables of what each
replica was sent (routing/blocks.py), the conversations' table, the round-robin turn, and
each llama.cpp replica's slots (routing/slots.py). The choices themselves are pure:
choice.choose, blocks.score, slots.Book.choose.

Cache-aware, a request whose prompt fills whole blocks goes to the replica holding the longest
run of them under the load bound (whose floor is the engine's batch size); one that no
replica holds any of, or too short for a block, is placed by affinity, then its prefix's place
on the ring, then the fewest outstanding (choice.py)."""

from __future__ import annotations

import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from django.conf import settings

from common import metrics
from deployments import kv_store
from openai_api import access
from openai_api.catalog import catalog
from openai_api.routing import kv_restore, slot_copy
from openai_api.routing.affinity import Affinity
from openai_api.routing.blocks import Table, score
from openai_api.routing.choice import Reason, choose, home
from openai_api.routing.engine_load import EngineLoads
from openai_api.routing.hints import Hint, current
from openai_api.routing.shared import Shared
from openai_api.routing.slots import UNPINNED, Book, Pinned, note
from openai_api.runtime_adapters import runtime_adapters

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

# Replicas whose tables are kept: past it, those of engines no longer routed to go.
MAX_TABLES = 256


class Router:
    def __init__(self, outstanding: dict[str, int]) -> None:
        self.outstanding = outstanding
        self.affinity = Affinity()
        self.shared = Shared(outstanding, self.affinity)
        self.turns = itertools.count()
        self.tables: dict[str, Table] = {}
        self.books: dict[str, Book] = {}
        self.kept: dict[str, str] = {}  # a replica whose slots are kept -> its deployment
        self.writer: ThreadPoolExecutor | None = None  # the ledgers', in order
        self.unwritten: dict[str, tuple[Path, dict[str, object]]] = {}
        self.engines = EngineLoads(self.ours)

    def ours(self, url: str) -> int:
        """The gateway's requests on the replica: this process's, and the others' where Redis
        shares them."""
        return self.outstanding.get(url, 0) + self.shared.remote.get(url, 0)

    def loads(self, urls: tuple[str, ...], floor: int = 1) -> dict[str, int]:
        """Each replica's requests: the gateway's outstanding ones, and those its engine held
        beyond them when last read; one whose KV cache is nearly full as if at the bound."""
        found = {url: self.ours(url) for url in urls}
        for url in urls:
            seen = self.engines.of(url)
            if seen is not None:
                found[url] += seen.others
                if seen.full:
                    found[url] = max(found[url], floor, sum(found.values()) + 1)
        return found

    async def take(self, urls: tuple[str, ...], deployment: str) -> tuple[str, Pinned | None]:
        """A replica for the running request (the only one, or the one `pick` chooses),
        counted outstanding until `give`, and its slot where the route's engine has slots the
        gateway chooses (also left in slots.pinned for the request's body)."""
        hint = current.get()
        url = urls[0] if len(urls) == 1 else (await self.pick(urls, deployment))[0]
        pin = None
        if hint is not None and hint.slots:
            pin = await self.pin(url, deployment, hint)
            note(pin)
        self.outstanding[url] = self.outstanding.get(url, 0) + 1
        return url, pin

    def give(self, url: str, slot: int = UNPINNED, served: bool = True) -> None:
        """The request on `url` (and its slot) ended; `served`: its engine answered it."""
        self.outstanding[url] -= 1
        book = self.books.get(url)
        if book is not None and 0 <= slot < len(book.slots):
            book.give(slot, served)
            self.ledger(url, book)

    def spoil(self, url: str, slot: int) -> None:
        """The request pinned to the slot failed: what the slot holds is not known."""
        book = self.books.get(url)
        if book is not None and 0 <= slot < len(book.slots):
            book.spoil(slot)

    async def pick(self, urls: tuple[str, ...], deployment: str) -> tuple[str, Reason]:
        """One of several replicas for the running request (its hint in hints.current); the
        choice is remembered for the conversation's next turn and told to the access record."""
        policy = settings.MSHIP_ROUTING_POLICY
        hint = current.get() if policy == "cache-aware" else None
        shared = self.shared.configured()
        if shared:
            self.shared.start()
        affine = None
        if hint is not None and hint.conversation is not None:
            affine = self.affinity.get(hint.conversation)
            if affine is None and shared and self.shared.healthy:
                affine = await self.shared.lookup(hint.conversation)
        self.watch(urls, deployment)
        loads = self.loads(urls, hint.batch if hint is not None else 1)
        epsilon = min(max(settings.MSHIP_ROUTING_LOAD_BOUND, 0.0), 100.0)
        cached, held = "", 0
        if hint is not None and hint.blocks:
            cached, held = score(
                ordered(urls, affine, hint),
                loads,
                hint.blocks,
                self.tables,
                floor=hint.batch,
                epsilon=epsilon,
                adapter_on=self.adapter_on(urls, hint),
            )
        reason: Reason
        if held:
            url, reason = cached, "cache"
        elif hint is not None and hint.blocks and affine not in urls:
            # A new prompt (no replica holds a block of it): the fewest outstanding, its
            # prefix's own replica among equals.
            url = cached
            reason = "prefix" if hint.prefix and url == home(hint.prefix, urls) else "load"
        else:
            url, reason = choose(
                urls,
                loads,
                policy=policy,
                affine=affine,
                prefix=hint.prefix if hint is not None else None,
                epsilon=epsilon,
                turn=next(self.turns),
                floor=hint.batch if hint is not None else 1,
            )
        if hint is not None:
            self.remember(url, urls, affine, hint, shared)
        metrics.routing_choices.labels(deployment, reason).inc()
        record = access.current.get()
        if record is not None:
            record.replica, record.routed_by = urls.index(url), reason
        return url, reason

    def watch(self, urls: tuple[str, ...], deployment: str) -> None:
        """The engines' own gauges read while their replicas are chosen among."""
        route = catalog.snapshot.routes.get(deployment) if catalog.snapshot else None
        if route is not None:
            self.engines.watch(urls, route.loader)

    def remember(
        self, url: str, urls: tuple[str, ...], affine: str | None, hint: Hint, shared: bool
    ) -> None:
        """The choice, for the conversation's next turn and the blocks' next request."""
        if hint.blocks:
            table = self.tables.get(url)
            if table is None:
                if len(self.tables) >= MAX_TABLES:
                    del self.tables[next(iter(self.tables))]  # the oldest, gone since
                table = self.tables[url] = Table()
            table.record(hint.blocks)
        # Another process finds a conversation at its prefix's own replica by itself: one
        # placed elsewhere (a spill, the least loaded, its blocks) is shared, and one moved.
        moved = affine is not None and affine != url
        natural = hint.prefix is not None and url == home(hint.prefix, urls)
        share = shared and (moved or (hint.prefix is not None and not natural))
        ttl = settings.MSHIP_ROUTING_AFFINITY_S
        for key in (hint.conversation, hint.also):
            if key is not None:
                self.affinity.put(key, url, ttl, share=share)

    def forget_gone(self) -> None:
        """The tables and slots of engines no longer in the routes (stopped, replaced): a
        new engine, even at the same address, holds none of what they say."""
        snapshot = catalog.snapshot
        if snapshot is None:
            return
        live = {u for r in snapshot.models for u in r.urls}
        for gone in [u for u in self.tables if u not in live]:
            del self.tables[gone]
        for gone in [u for u in self.books if u not in live and not self.outstanding.get(u)]:
            del self.books[gone]
            self.kept.pop(gone, None)
        slot_copy.cannot.intersection_update(live)  # a new engine at an old address may

    @staticmethod
    def adapter_on(urls: tuple[str, ...], hint: Hint) -> frozenset[str]:
        """The replicas that have the runtime adapter the request needs loaded."""
        if not hint.adapter:
            return frozenset()
        held = runtime_adapters.replicas
        return frozenset(u for u in urls if u in held and hint.adapter in held[u].used)

    async def pin(self, url: str, deployment: str, hint: Hint) -> Pinned:
        """The request's slot on `url`, with a saved cache restored into it where one holds
        more of its prompt than the slot does."""
        book = self.books.get(url)
        if book is None or len(book.slots) != hint.slots:
            if len(self.books) >= MAX_TABLES:
                del self.books[next(iter(self.books))]
            book = self.books[url] = Book.of(hint.slots)
        copy_min = copy_blocks(deployment, url)
        slot, held, same = book.choose(hint.blocks, hint.marks, copy_min)
        if slot == UNPINNED:
            return Pinned()
        free = not book.slots[slot].busy
        donor, run = UNPINNED, 0
        if copy_min and free and not same:
            donor, run = book.donor(hint.blocks, slot)
            if run - held < copy_min:
                donor = UNPINNED
        # Before any await: no other request takes the slot, nor one on the donor changes it.
        book.take(slot, hint.blocks, hint.marks)
        copying = (donor, slot) if donor != UNPINNED else ()
        for index in copying:
            book.lend(index)
        if hint.keep:
            self.kept[url] = deployment
        try:
            pin = await self.fill(
                url,
                deployment,
                hint,
                Pinned(slot, "hit" if held else "miss", held),
                free,
                same,
                (donor, run),
            )
        except BaseException:  # cancelled (its caller left): the slot is let go
            book.give(slot, served=False)
            raise
        finally:
            for index in copying:
                book.lent(index)
        self.ledger(url, book)  # an adapter's request too: the slot no longer holds the base's
        return pin

    @staticmethod
    async def fill(
        url: str,
        deployment: str,
        hint: Hint,
        pin: Pinned,
        free: bool,
        same: bool,
        donor: tuple[int, int],
    ) -> Pinned:
        """The pinned slot given more of the request's prompt where it can be: a cache saved
        at the engine's last stop restored into it, else another free slot's copied."""
        if hint.keep and free:  # a busy slot is another request's: nothing is restored there
            try:
                found = await kv_restore.restore(
                    deployment, url, pin.slot, hint, (pin.blocks, same)
                )
            except Exception:  # the request is served cold, as if nothing had been saved
                log.exception("%s: a saved slot cache was not restored", deployment)
                found = None
            if found is not None:
                pin = Pinned(pin.slot, "restored", found)
        if donor[0] == UNPINNED or donor[1] <= pin.blocks:
            return pin
        try:
            copied = await slot_copy.copy(deployment, url, donor[0], pin.slot)
        except Exception:  # the request computes its prompt, as if no slot held it
            log.exception("%s: a slot's cache was not copied", deployment)
            copied = False
        return Pinned(pin.slot, "copied", donor[1]) if copied else pin

    def ledger(self, url: str, book: Book) -> None:
        """The replica's slots written where its stop reads them: off the event loop, the
        latest state of each replica once however many changes came while one was written."""
        deployment = self.kept.get(url)
        if deployment is None:
            return
        if self.writer is None:
            self.writer = ThreadPoolExecutor(1, thread_name_prefix="modelship-ledger")
        waiting = url in self.unwritten
        self.unwritten[url] = (kv_store.folder(deployment), book.ledger())
        if not waiting:
            self.writer.submit(self.write_ledger, url)

    def write_ledger(self, url: str) -> None:
        where, said = self.unwritten.pop(url)
        try:
            kv_store.write_ledger(where, url, said)
        except OSError as exc:  # its slots are then not saved at the stop: recomputed after
            log.warning("the slot ledger of %s not written: %s", url, exc)


def copy_blocks(deployment: str, url: str) -> int:
    """How many more blocks another free slot must hold for its cache to be copied into a
    request's slot (0: none is, the route's engines or this one cannot)."""
    route = catalog.snapshot.routes.get(deployment) if catalog.snapshot else None
    if route is None or not route.copies_slots or url in slot_copy.cannot:
        return 0
    return max(0, settings.MSHIP_SLOT_COPY_MIN_BLOCKS)


def ordered(urls: tuple[str, ...], affine: str | None, hint: Hint) -> tuple[str, ...]:
    """The replicas in the order ties go: the conversation's own, then as listed from the
    prefix key's own replica on the ring on."""
    start = home(hint.prefix, urls) if hint.prefix else None
    ring_order = urls
    if start is not None:
        at = urls.index(start)
        ring_order = urls[at:] + urls[:at]
    if affine in urls:
        return (affine, *(u for u in ring_order if u != affine))
    return ring_order
