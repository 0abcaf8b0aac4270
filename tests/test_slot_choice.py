"""The slot inside a llama.cpp replica (openai_api/routing/slots.py) and the router that
weighs blocks (openai_api/routing/router.py), as tables: a conversation returns to its slot,
a new one takes the least recently used, a busy slot is never pinned; the owner refuses a
hint that is not one; `id_slot` is the last word of the body."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import Any

import pytest

from ondemand.scheduler.replica_link import pinned_of
from openai_api.engine_dialect import with_slot
from openai_api.routing import hints
from openai_api.routing.blocks import MAX_BLOCKS
from openai_api.routing.hints import Hint, hint_of
from openai_api.routing.router import Router
from openai_api.routing.slots import UNPINNED, Book, Pinned

SYSTEM = "You keep the ledger of the accounts team, line by line. " * 30


def chat(*turns: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}]
    for n, text in enumerate(turns):
        messages.append({"role": "user" if n % 2 == 0 else "assistant", "content": text})
    return {"messages": messages}


def keys(data: dict[str, Any], tenant: str = "team:1") -> Hint:
    return hint_of(data, {}, "1", 1000, tenant)


def test_it_returns_a_conversation_to_its_slot_else_the_longest_run_else_the_oldest() -> None:
    book = Book.of(3)
    ada, grace = keys(chat("I am Ada.")), keys(chat("I am Grace."))
    assert ada.blocks == grace.blocks and ada.marks != grace.marks  # one system prompt
    assert book.choose(ada.blocks, ada.marks) == (0, 0, False)
    book.take(0, ada.blocks, ada.marks)
    book.give(0)
    # Grace shares Ada's blocks: Ada's slot, not an empty one (the prompt is not computed
    # again; Ada's conversation goes to llama.cpp's host-memory cache).
    assert book.choose(grace.blocks, grace.marks) == (0, len(grace.blocks), False)
    book.take(0, grace.blocks, grace.marks)
    book.give(0)
    later = keys(chat("I am Grace.", "Hello Grace.", "And the total?"))
    assert grace.marks[-1] in later.marks  # her first request is an earlier state of this one
    assert book.choose(later.blocks, later.marks) == (0, len(grace.blocks), True)
    # Nothing in common with any slot: the least recently used.
    other = {"messages": [{"role": "user", "content": "Something else entirely. " * 40}]}
    lin = keys(other)
    assert book.choose(lin.blocks, lin.marks)[0] == 1
    book.take(1, lin.blocks, lin.marks)
    book.give(1)
    assert book.choose((), ())[0] == 2
    # A busy slot is taken only when every one is: the least busy, so the table stays what
    # the engine holds.
    for slot in range(3):
        book.take(slot, ())
    book.take(0, ())
    assert book.choose(later.blocks, later.marks)[0] in (1, 2)  # not the busiest
    book.give(1)
    assert book.choose(later.blocks, later.marks)[0] == 1
    # A request that failed: what its slot holds is not known.
    book.take(2, later.blocks, later.marks)
    book.give(2, served=False)
    assert book.slots[2].blocks == () and book.slots[2].mark == 0


def test_it_copies_a_shared_prefix_from_a_free_slot_rather_than_displace_a_history() -> None:
    book = Book.of(3)
    ada = keys(chat("I am Ada.", "Hello Ada.", "Check the second line of the ledger. " * 30))
    grace = keys(chat("I am Grace."))
    book.take(0, ada.blocks, ada.marks)
    book.give(0)
    shared = len(grace.blocks)
    assert shared > len(ada.blocks) - shared > 1  # her history is shorter than the prompt
    # With no copy: Ada's slot (her history beyond the system prompt is lost).
    assert book.choose(grace.blocks, grace.marks) == (0, shared, False)
    # With a copy of 2 blocks or more: a free slot, given Ada's cache; Ada keeps hers.
    slot, held, _ = book.choose(grace.blocks, grace.marks, copy_min=2)
    assert slot == 1 and held == 0
    assert book.donor(grace.blocks, slot) == (0, shared)
    # A copy that would gain fewer blocks than asked is not made.
    assert book.choose(grace.blocks, grace.marks, copy_min=shared + 1)[0] == 0
    # A busy slot gives no copy (llama.cpp saves it only once its request ends), and a lent
    # one takes no request while it is read.
    book.lend(0)
    assert book.donor(grace.blocks) == (UNPINNED, 0)
    assert book.choose(grace.blocks, grace.marks, copy_min=2)[0] == 1
    # Every other slot busy: the busy ones first, the slot being copied last (a request sent
    # there before the copy would hold it up for a whole answer).
    book.take(1, ())
    book.take(2, ())
    assert book.choose(grace.blocks, grace.marks)[0] in (1, 2)
    # Ada's own next turn waits the copy out in her slot rather than move.
    later = keys(
        chat("I am Ada.", "Hello Ada.", "Check the second line of the ledger. " * 30, "ok")
    )
    assert book.choose(later.blocks, later.marks)[0] == 0
    book.give(1)
    book.give(2)
    book.spoil(1)
    book.spoil(2)
    book.lent(0)
    assert book.slots[0].busy == 0 and book.slots[0].blocks == ada.blocks
    assert book.slots[0].copying == 0
    # Where the copy gains nothing over a slot holding the run, no copy is made.
    book.take(2, grace.blocks, grace.marks)
    book.give(2)
    lin = keys(chat("I am Lin."))
    assert lin.blocks == grace.blocks and lin.marks[-1] != grace.marks[-1]
    assert book.choose(lin.blocks, lin.marks, copy_min=2)[0] == 2
    book.spoil(2)
    # Among donors holding the same run, the smallest cache (the whole cache is copied).
    book.take(2, grace.blocks, grace.marks)
    book.give(2)
    assert book.donor(grace.blocks, 1) == (2, shared)


def test_it_takes_the_owners_copied_slot_as_it_said_it() -> None:
    assert pinned_of({"slot": 1, "cache": "copied", "blocks": 3}, 2) == Pinned(1, "copied", 3)
    assert pinned_of({"slot": 1, "cache": "restored"}, 2) == Pinned(1, "restored", 0)
    assert pinned_of({"slot": 1, "cache": "stolen", "blocks": 3}, 2) == Pinned()
    assert pinned_of({"slot": 2, "cache": "hit"}, 2) == Pinned()


def _of(hint: Hint) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return hint.blocks, hint.marks


def test_it_keeps_each_tenants_marks_apart() -> None:
    mine, theirs = keys(chat("I am Ada."), "team:1"), keys(chat("I am Ada."), "team:2")
    assert not set(mine.marks) & set(theirs.marks)
    assert not set(mine.blocks) & set(theirs.blocks)


def test_it_refuses_a_hint_from_a_gateway_that_is_not_one() -> None:
    good = keys(chat("I am Ada."))
    said = json.loads(json.dumps(asdict(good)))
    assert Hint.received(said) == good
    for bad in (
        {"blocks": list(range(MAX_BLOCKS + 1))},
        {"blocks": [1 << 64]},
        {"blocks": [-1]},
        {"marks": ["1"]},
        {"blocks": "1,2"},
        {"slots": 1 << 20},
        {"batch": -1},
        {"batch": 1.5},
        {"tenant": 5},
        {"prefix": "x" * (1 << 20)},
    ):
        with pytest.raises(ValueError, match="hint"):
            Hint.received({**said, **bad})


def test_it_says_id_slot_last_so_the_engine_takes_it_over_the_callers() -> None:
    body = json.dumps({"messages": [], "id_slot": 3}).encode() + b"\n "
    pinned = with_slot(body, 1)
    assert pinned.endswith(b'"id_slot":1}')
    assert json.loads(pinned)["id_slot"] == 1  # the last of a key said twice, as llama.cpp
    assert json.loads(with_slot(b"{}", 0)) == {"id_slot": 0}
    assert with_slot(b"[1]", 0) == b"[1]"  # not an object: left as it is


def test_it_routes_by_blocks_under_a_floor_and_pins_slots() -> None:
    outstanding: dict[str, int] = {}
    router = Router(outstanding)
    urls = ("http://a", "http://b")
    hint = Hint(**{**asdict(keys(chat("I am Ada."))), "batch": 4, "slots": 2})

    async def place(times: int) -> list[tuple[str, int]]:
        placed = []
        for _ in range(times):
            token = hints.current.set(hint)
            try:
                url, pin = await router.take(urls, "chat")
            finally:
                hints.current.reset(token)
            placed.append((url, pin.slot if pin is not None else UNPINNED))
        return placed

    first = asyncio.run(place(1))
    home = first[0][0]
    # Held by its blocks until the replica holds the floor (the engine's batch): 4 in all,
    # though the mean bound alone (ceil(1.25 * 2 / 2)) would have spilled the second.
    placed = first + asyncio.run(place(3))
    assert [url for url, _ in placed] == [home] * 4
    assert [slot for _, slot in placed] == [0, 1, 0, 1]  # two slots: then queued in them
    assert asyncio.run(place(1))[0][0] != home  # past the floor: the other replica
    router.give(home, 0)
    assert router.books[home].slots[0].busy == 1 and outstanding[home] == 3  # of 2
