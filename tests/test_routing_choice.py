"""The replica choice, as a table: affinity first, then the prefix's place on the ring
under a load bound, then the fewest outstanding; the same in any process; a replica added
or removed moves only its own keys."""

from __future__ import annotations

import collections

import pytest

from openai_api.routing.choice import bound, choose

A, B, C, D = (f"http://127.0.0.1:{port}" for port in (9001, 9002, 9003, 9004))
THREE = (A, B, C)
KEYS = [f"tenant {i}: You are a helpful assistant for the accounts team." for i in range(3000)]


def by_prefix(urls: tuple[str, ...], key: str, loads: dict[str, int] | None = None) -> str:
    url, reason = choose(urls, loads or {}, prefix=key)
    assert reason == "prefix"
    return url


def test_it_sends_a_prefix_to_the_same_replica_whatever_order_the_replicas_are_listed_in() -> None:
    for key in KEYS[:200]:
        assert by_prefix(THREE, key) == by_prefix((C, A, B), key) == by_prefix((B, C, A), key)


def test_it_spreads_keys_about_evenly() -> None:
    shares = collections.Counter(by_prefix(THREE, key) for key in KEYS)
    assert set(shares) == set(THREE)
    assert all(800 < n < 1200 for n in shares.values()), shares


def test_it_moves_only_a_removed_replicas_keys() -> None:
    before = {key: by_prefix((A, B, C, D), key) for key in KEYS}
    after = {key: by_prefix(THREE, key) for key in KEYS}
    moved = [key for key in KEYS if before[key] != after[key]]
    assert moved and all(before[key] == D for key in moved)
    assert len(moved) == sum(1 for url in before.values() if url == D)


def test_it_moves_only_keys_to_an_added_replica() -> None:
    before = {key: by_prefix(THREE, key) for key in KEYS}
    after = {key: by_prefix((A, B, C, D), key) for key in KEYS}
    assert all(after[key] == D for key in KEYS if before[key] != after[key])
    assert 500 < sum(1 for url in after.values() if url == D) < 1000


def test_it_spills_a_hot_prefix_once_its_replica_is_at_the_bound() -> None:
    hot = KEYS[0]
    home = by_prefix(THREE, hot)
    loads: dict[str, int] = {}
    placed = []
    for _ in range(30):  # thirty requests of one prefix, none finished yet
        url, reason = choose(THREE, loads, prefix=hot, epsilon=0.25)
        assert reason == "prefix"
        loads[url] = loads.get(url, 0) + 1
        placed.append(url)
        # No replica above the bound while another has room.
        assert max(loads.values()) <= bound({u: n for u, n in loads.items()}, THREE, 0.25)
    assert placed[0] == home
    # Its own replica holds the most: it took every request the bound let it.
    assert loads[home] == max(loads.values()) == 13  # ceil(1.25 * 31 / 3)
    assert set(placed) == set(THREE)


@pytest.mark.parametrize(
    ("loads", "affine", "expected"),
    [
        ({}, B, (B, "affinity")),
        ({A: 1, B: 1, C: 1}, C, (C, "affinity")),
        # B over the bound (ceil(1.25 * 5 / 3) = 3): the prefix decides, skipping B.
        ({B: 3, A: 1}, B, (None, "prefix")),
        # Gone or draining (not among the replicas): the prefix decides.
        ({}, D, (None, "prefix")),
    ],
)
def test_it_returns_a_conversation_to_its_replica_while_it_has_room(
    loads: dict[str, int], affine: str, expected: tuple[str | None, str]
) -> None:
    url, reason = choose(THREE, loads, affine=affine, prefix=KEYS[7])
    assert reason == expected[1]
    if expected[0] is not None:
        assert url == expected[0]
    else:
        assert url != B or affine == D


def test_it_takes_the_fewest_outstanding_without_keys_or_under_that_policy() -> None:
    loads = {A: 3, B: 1, C: 2}
    assert choose(THREE, loads) == (B, "load")
    assert choose(THREE, loads, policy="least-outstanding", affine=A, prefix="x") == (B, "load")


def test_it_takes_each_replica_in_turn_round_robin() -> None:
    chosen = [choose(THREE, {}, policy="round-robin", turn=i, affine=A)[0] for i in range(6)]
    assert chosen == [A, B, C, A, B, C]
