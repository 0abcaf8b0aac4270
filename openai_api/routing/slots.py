"""The slot inside a llama.cpp replica: which of its `parallel` slots a request is pinned to
(`id_slot`), so a continuing conversation meets the KV cache its last turn left there.

Each replica's book keeps, per slot, the block hashes of the prompt it was last sent
(routing/blocks.py: chained, so a run of equal hashes is a shared prefix, within one tenant
only) and the mark of its whole text (an earlier request of a conversation is among its later
one's marks), whether a request is on it, and when it was last used. A request goes to the
free slot holding its conversation, else to the free slot where the least is computed in
all (what it must compute there and what the conversation it displaces loses); when every
slot is busy, to the least busy (llama.cpp queues it there).
The choice is made where the replica choice is (the scheduler's owner, where several gateway
processes serve), so no two processes pin two conversations to one slot.

Where the route keeps its caches across a stop (deployments/kv_store.py), each change of a slot is
written to the replica's ledger, which the stop reads to save the slots worth keeping.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from common.chains import shared_run
from openai_api import access

if TYPE_CHECKING:
    from collections.abc import Sequence

Cache = Literal["restored", "copied", "hit", "miss"]
UNPINNED: Final = -1


@dataclass(frozen=True, slots=True)
class Pinned:
    """What the choice decided for the running request: its slot (UNPINNED: none), and
    what it expects of the engine's cache (the `x-modelship-cache` header)."""

    slot: int = UNPINNED
    cache: Cache = "miss"
    blocks: int = 0  # blocks of its prompt the slot (or the replica) holds


pinned: ContextVar[Pinned | None] = ContextVar("modelship_pinned_slot", default=None)


def served() -> bool:
    """Whether the running request's answer was the engine's (a 2xx): only then does its slot
    hold what the table says."""
    record = access.current.get()
    return record is None or 200 <= record.status < 300


def note(pin: Pinned) -> None:
    """The slot for the request's body, its cache for its answer's header and access line."""
    pinned.set(pin)
    record = access.current.get()
    if record is not None and pin.slot != UNPINNED:
        record.cache = pin.cache


@dataclass
class Slot:
    blocks: tuple[int, ...] = ()
    busy: int = 0
    used: float = 0.0  # wall time of its last request's end (the ledger's "recent")
    done: bool = True  # its last request ended: the cache holds that prompt and its answer
    mark: int = 0  # its last request's whole text, hashed (blocks.marks): its conversation
    copying: int = 0  # its cache is being copied from or into (routing/slot_copy.py)


@dataclass
class Book:
    slots: list[Slot] = field(default_factory=list)

    @classmethod
    def of(cls, count: int) -> Book:
        return cls([Slot() for _ in range(count)])

    def choose(
        self, blocks: Sequence[int], marks: Sequence[int] = (), copy_min: int = 0
    ) -> tuple[int, int, bool]:
        """The slot for a request with these blocks and marks, how many of its blocks it
        holds, and whether it holds an earlier request of its conversation. A free slot
        first: the one holding its conversation, else the one where the least is computed
        in all: what the request must compute there (its blocks beyond the slot's run, or
        beyond the run a free slot's copy gives it, where `copy_min` or more blocks longer)
        plus what the conversation it displaces loses (the slot's blocks beyond that run,
        computed again at its next turn: llama.cpp keeps a slot's cache nowhere else), the
        least recently used among equals. A long system prompt is shared; a long history
        is not displaced for it. With none free, the least busy: llama.cpp queues it there,
        and the table stays what the engine holds (an unpinned request would land where no
        one knows)."""
        best, best_key = UNPINNED, None
        copied = self.donor(blocks)[1] if copy_min > 0 else 0
        for index, slot in enumerate(self.slots):
            held = shared_run(slot.blocks, blocks) if blocks else 0
            same = bool(slot.mark) and slot.mark in marks
            copy = copied - held >= copy_min > 0 and not slot.busy
            given = copied if copy else held
            # And the request's own length, the same anywhere.
            lost = len(slot.blocks) - held - given
            # A slot being copied is taken last: llama.cpp would put a request sent to it
            # before the copy, and the copy would wait for its whole answer.
            # (Its own conversation waits the copy out there rather than move.)
            copying = slot.copying > 0 and not same
            key = (copying, slot.busy, not same, lost, copy, slot.used, index, held)
            if best_key is None or key < best_key:
                best, best_key = index, key
        if best_key is None:
            return UNPINNED, 0, False
        return best, best_key[7], not best_key[2]

    def take(self, index: int, blocks: Sequence[int], marks: Sequence[int] = ()) -> None:
        slot = self.slots[index]
        slot.blocks, slot.busy, slot.done = tuple(blocks), slot.busy + 1, False
        slot.mark = marks[-1] if marks else 0

    def donor(self, blocks: Sequence[int], other_than: int = UNPINNED) -> tuple[int, int]:
        """The free slot whose cache is best copied for a request with these blocks, and the
        run of them it holds: the longest run, the least held beyond it among equals (the
        whole cache is copied, not its run only); (UNPINNED, 0) where none holds any."""
        best, best_key = UNPINNED, (0, 0)
        for index, slot in enumerate(self.slots):
            if slot.busy or slot.copying or not slot.done or index == other_than or not blocks:
                continue
            held = shared_run(slot.blocks, blocks)
            key = (held, -len(slot.blocks))
            if held and key > best_key:
                best, best_key = index, key
        return best, best_key[0]

    def lend(self, index: int) -> None:
        """The slot's cache is being copied (from or into it): no request is put on it
        while another slot is free, nor before every other slot is busy."""
        self.slots[index].copying += 1

    def lent(self, index: int) -> None:
        """The copy ended: the slot as it was (when it was last used is unchanged)."""
        slot = self.slots[index]
        slot.copying = max(0, slot.copying - 1)

    def give(self, index: int, served: bool = True) -> None:
        slot = self.slots[index]
        slot.busy = max(0, slot.busy - 1)
        slot.used, slot.done = time.time(), slot.busy == 0
        if not served:
            self.spoil(index)

    def spoil(self, index: int) -> None:
        """What the slot holds is not known (its request failed, or never reached it): no
        conversation is found there, nor saved from it."""
        slot = self.slots[index]
        slot.blocks, slot.mark = (), 0

    def holds(self, blocks: Sequence[int]) -> int:
        """The longest run of these blocks any slot holds."""
        return max((shared_run(s.blocks, blocks) for s in self.slots), default=0)

    def ledger(self) -> dict[str, object]:
        """What the stop reads: each slot's blocks, whether its last request ended, when."""
        return {
            "slots": [
                {
                    "blocks": list(s.blocks),
                    "mark": s.mark,
                    "done": s.done and not s.busy,
                    "used": s.used,
                }
                for s in self.slots
            ]
        }
