"""The block scorer (openai_api/routing/blocks.py) as a table: the longest run of a request's
blocks wins, the load bound has a floor at the engine's batch size, an adapter already
loaded counts, ties go to the fewest outstanding then the order given, and one tenant's
blocks never match another's."""

from __future__ import annotations

from typing import Any

import pytest

from openai_api.routing.blocks import (
    ADAPTER_BLOCKS,
    BLOCK_CHARS,
    Table,
    block_hashes,
    laid_out,
    score,
)

A, B, C = "http://a", "http://b", "http://c"
SYSTEM = "You are a careful assistant. " * 80  # about four blocks


def chat(*turns: str, system: str = SYSTEM, **more: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    for n, text in enumerate(turns):
        messages.append({"role": "user" if n % 2 == 0 else "assistant", "content": text})
    return {"messages": messages, **more}


def blocks(data: dict[str, Any], scope: str = "team:1") -> tuple[int, ...]:
    return block_hashes(laid_out(data), scope)


def test_it_keys_whole_blocks_chained_so_a_block_stands_for_all_before_it() -> None:
    first = blocks(chat("hello " * 200))
    longer = blocks(chat("hello " * 200, "hi there " * 100, "and more " * 100))
    assert len(first) >= 4 and longer[: len(first)] == first
    changed = blocks(chat("hello " * 200, system="Today is 7 December. " + SYSTEM))
    assert not set(changed) & set(first)  # an edit early on changes every block after it
    assert len(laid_out(chat("x" * (BLOCK_CHARS * 1000)))) <= BLOCK_CHARS * 128 + 64
    assert blocks(chat("hello " * 200), scope="team:2")[0] != first[0]  # another tenant's


def test_it_counts_an_image_by_its_identity_and_tools_first() -> None:
    def with_image(url: str) -> dict[str, Any]:
        content = [
            {"type": "text", "text": "look " * 150},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        return chat(SYSTEM, **{}) | {"messages": [{"role": "user", "content": content}] * 3}

    assert blocks(with_image("data:image/png;base64,AAAA")) != blocks(
        with_image("data:image/png;base64,BBBB")
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert blocks(chat("hi", tools=tools))[0] != blocks(chat("hi"))[0]


def held_by(url: str, data: dict[str, Any]) -> dict[str, Table]:
    table = Table()
    table.record(blocks(data))
    return {url: table}


def test_it_sends_a_request_to_the_replica_with_the_longest_run_of_its_blocks() -> None:
    earlier = chat("a long first question " * 40, "an answer " * 60)
    tables = held_by(B, chat("a long first question " * 40)) | held_by(C, earlier)
    later = blocks(chat("a long first question " * 40, "an answer " * 60, "next " * 30))
    url, held = score((A, B, C), {}, later, tables)
    assert url == C and held == len(blocks(earlier))
    assert score((A, B), {}, later, tables)[0] == B  # the shorter run where C is gone


@pytest.mark.parametrize(
    ("loads", "floor", "run", "chosen"),
    [
        ({C: 1}, 1, 1, A),  # at low load the plain bound is 1: C is full, a short run is lost
        ({C: 1}, 4, 1, C),  # the engine's 4 slots are the floor: C keeps the conversation
        ({C: 4}, 4, 1, A),  # past its batch size, the next with room
        ({C: 1}, 1, 6, C),  # a long run waits rather than is computed again: twice the bound
        ({C: 7}, 4, 6, C),
        ({C: 8}, 4, 6, A),  # past twice the bound, the next with room
    ],
)
def test_it_holds_affinity_up_to_the_engines_batch_size(
    loads: dict[str, int], floor: int, run: int, chosen: str
) -> None:
    data = chat("question " * 100)
    table = Table()
    table.record(blocks(data)[:run])
    assert score((A, B, C), loads, blocks(data), {C: table}, floor=floor)[0] == chosen


def test_it_weighs_an_adapter_loaded_and_breaks_ties_by_load_then_order() -> None:
    data = chat("question " * 100)
    short = Table()
    short.record(blocks(data)[:1])
    tables = {A: short}
    assert score((A, B), {}, blocks(data), tables, adapter_on=frozenset({B}))[0] == B
    assert ADAPTER_BLOCKS > 1
    assert score((A, B, C), {A: 2, B: 1, C: 1}, (), {})[0] == B
    assert score((A, B, C), {}, (), {})[0] == A
    with pytest.raises(ValueError, match="no replica"):
        score((), {}, (), {})


def test_it_spreads_new_prompts_to_the_replica_holding_the_least_at_equal_load() -> None:
    # Every replica idle (a think time between turns): a new tenant's prompt goes to the
    # replica holding nothing, not to the ring's first, where another tenant's cache is.
    tables = held_by(A, chat(system="tenant one's rules " * 60))
    tables |= held_by(B, chat(system="tenant two " * 90))
    new = blocks(chat(system="tenant three's rules " * 60))
    assert score((A, B, C), {}, new, tables) == (C, 0)
    assert score((A, B), {}, new, tables)[0] == B  # the smaller table
    assert score((A, B, C), {C: 1}, new, tables)[0] == B  # load first
    # A replica holding a run of it is chosen whatever its table holds besides.
    held = tables | held_by(C, chat(system="tenant three's rules " * 60))
    assert score((A, B, C), {}, new, held)[0] == C


def test_it_keeps_a_bounded_table_the_most_recent_last() -> None:
    table = Table(limit=6)
    old, new = blocks(chat("old " * 300)), blocks(chat("new " * 300))
    table.record(old)
    table.record(new)
    assert len(table.kept) == 6
    assert table.longest(new) == len(new)
    # Its own blocks went first; the system prompt it shares with the newer one stays.
    assert table.longest(old) == len(blocks(chat(system=SYSTEM))) < len(old)


def test_it_evicts_a_requests_last_blocks_before_its_first() -> None:
    table = Table(limit=4)
    table.record((1, 2, 3, 4))
    table.record((5, 6))  # two of the first request's blocks go: its last two
    assert table.longest((1, 2, 3, 4)) == 2
    assert table.longest((5, 6)) == 2
