"""The prompt as the engine's cache sees it, in blocks, and the replicas scored by the longest
run of its blocks each was sent recently (issue 61, "Routing by the longest cached prefix";
the Gateway API inference extension's prefix scorer and vLLM production-stack's prefix
router work the same way).

A request's blocks: its prompt laid out in order (tools first, then each message's role and
text; an image by its identity, not its bytes), cut into BLOCK_CHARS pieces, each hashed
with the hash before it and the tenant's scope, so block k's hash stands for the whole
prompt up to it, within one tenant only. A replica's table keeps the hashes it was sent, the
most recent last, up to MAX_KEPT; every request records its blocks last to first, so a
block's predecessors are never less recent than it (never evicted before it), and the
longest run a replica holds is found by bisection over the chain.

The choice (`score`): among the replicas under the load bound, whose floor is the engine's
batch size (its `parallel` slots, vLLM's `max_num_seqs`), so affinity holds at low load, the
one with the longest run; an adapter the request needs, loaded on a replica, is worth
ADAPTER_BLOCKS blocks; among equals the fewest outstanding, then the order given (the
ring's). Pure but for the tables: every process that holds the same tables makes the same
choice.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from openai_api.routing.choice import bound

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

BLOCK_CHARS: Final = 512  # about 128 tokens: a block a cache keeps or misses whole
MAX_BLOCKS: Final = 128  # 64 KiB of a prompt read at most (the hints' own scan bound)
MAX_KEPT: Final = 50_000  # hashes a replica's table keeps (8 bytes each and the dict's)
ADAPTER_BLOCKS: Final = 8  # what an adapter already loaded is worth, in blocks
LONG_RUN: Final = 4  # blocks held (about 500 tokens) that let a replica pass its load bound
SEPARATOR: Final = "\x1e"
MAX_TOOLS: Final = 128  # tools read for the layout (their JSON cut at the blocks' budget)


def laid_out(data: Mapping[str, Any]) -> str:
    """A chat, completions or Responses body as one text in the order the engine reads it:
    its tools, then each message's role and content; an image by the hash of its address or
    data. Read no further than the blocks can use."""
    return layout(data)[0]


def layout(data: Mapping[str, Any]) -> tuple[str, list[int]]:
    """The text `laid_out` gives, and where in it each message ends."""
    budget = BLOCK_CHARS * MAX_BLOCKS
    parts: list[str] = []
    ends: list[int] = []
    size = 0

    def put(text: str) -> bool:
        nonlocal size
        parts.append(text[: budget - size])
        size += len(parts[-1]) + 1
        return size < budget

    def done() -> tuple[str, list[int]]:
        return SEPARATOR.join(parts), ends

    def ends_at() -> bool:
        ends.append(size - 1)
        return True

    tools = data.get("tools")
    if isinstance(tools, list) and tools and not put(canonical(tools[:MAX_TOOLS])[:budget]):
        return done()
    system = data.get("system")  # Anthropic's messages: the system prompt beside them
    if system is not None and not (all(put(text) for text in texts(system)) and ends_at()):
        return done()
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        put(prompt)
        ends.append(size - 1)
        return done()
    found = data.get("messages")
    messages: list[Any] = found if isinstance(found, list) else []
    if not isinstance(found, list):  # Responses: its instructions, then its input items
        given = data.get("input")
        messages = list(given) if isinstance(given, list) else []
        if isinstance(data.get("instructions"), str):
            messages = [{"role": "system", "content": data["instructions"]}, *messages]
    for message in messages:
        if not isinstance(message, dict):
            continue
        if not put(str(message.get("role", ""))[:32]):
            break
        if not all(put(text) for text in texts(message.get("content"))):
            break
        ends.append(size - 1)
    return done()


def marks(text: str, ends: Sequence[int], scope: str) -> tuple[int, ...]:
    """A hash of the text up to each message's end, seeded with the tenant's scope (the
    last MAX_BLOCKS): a conversation's earlier request is one of its later one's marks."""
    found = []
    whole = hashlib.blake2b(scope.encode(), digest_size=8)
    start = 0
    for end in ends:
        whole.update(text[start:end].encode())
        start = end
        found.append(int.from_bytes(whole.copy().digest(), "big"))
    return tuple(found[-MAX_BLOCKS:])


def texts(content: Any) -> Iterable[str]:
    """A message's content as the pieces an engine reads: text as it is, an image or a file
    by a digest of its reference."""
    if isinstance(content, str):
        yield content
        return
    if not isinstance(content, list):
        return
    for part in content:
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        if isinstance(text, str):
            yield text
            continue
        reference = part.get("image_url") or part.get("file") or part.get("input_audio")
        if isinstance(reference, dict) and isinstance(reference.get("url"), str):
            reference = reference["url"]
        if reference is not None:
            # A data: URL hashed (its first MiB), never kept nor serialised whole.
            source = reference if isinstance(reference, str) else canonical(reference)
            source = source[: 1 << 20]
            yield "image:" + hashlib.blake2b(source.encode(), digest_size=8).hexdigest()


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def block_hashes(text: str, scope: str) -> tuple[int, ...]:
    """The chained hashes of the text's whole blocks, seeded with the tenant's scope."""
    hashes = []
    previous = hashlib.blake2b(scope.encode(), digest_size=8).digest()
    for start in range(0, min(len(text), BLOCK_CHARS * MAX_BLOCKS), BLOCK_CHARS):
        block = text[start : start + BLOCK_CHARS]
        if len(block) < BLOCK_CHARS:
            break  # a part block: engines cache whole blocks, and the next turn adds to it
        previous = hashlib.blake2b(previous + block.encode(), digest_size=8).digest()
        hashes.append(int.from_bytes(previous, "big"))
    return tuple(hashes)


@dataclass
class Table:
    """The block hashes one replica was sent, the least recent first."""

    kept: OrderedDict[int, None] = field(default_factory=OrderedDict)
    limit: int = MAX_KEPT

    def record(self, hashes: Sequence[int]) -> None:
        for value in reversed(hashes):  # the first block the most recent: it goes last
            self.kept[value] = None
            self.kept.move_to_end(value)
        while len(self.kept) > self.limit:
            self.kept.popitem(last=False)

    def longest(self, hashes: Sequence[int]) -> int:
        """How many of the request's leading blocks this replica holds: a block held means
        its predecessors are (recorded with it, and never evicted before it)."""
        low, high = 0, len(hashes)
        while low < high:
            middle = (low + high + 1) // 2
            if hashes[middle - 1] in self.kept:
                low = middle
            else:
                high = middle - 1
        return low


def score(
    urls: Sequence[str],
    loads: Mapping[str, int],
    hashes: Sequence[int],
    tables: Mapping[str, Table],
    *,
    floor: int = 1,
    epsilon: float = 0.25,
    adapter_on: frozenset[str] = frozenset(),
) -> tuple[str, int]:
    """The replica for a request and the blocks it holds of it. `floor`: the engine's batch
    size, below which the load bound never falls; `adapter_on`: the replicas that have the
    adapter the request needs loaded. A replica holding LONG_RUN blocks or more of it may
    take it up to twice the bound: computing that much again elsewhere costs more than
    waiting behind a few requests. No replica holding any: the fewest outstanding, then the
    one whose table holds the fewest blocks, so that new prompts (a tenant's system prompt)
    spread: at low load every replica has none outstanding, and the ring alone would put two
    tenants on one replica while another holds nothing."""
    if not urls:
        raise ValueError("no replica to choose from")
    cap = bound(loads, tuple(urls), epsilon, floor)
    # Each replica's run of the request's blocks, and how many blocks its table holds (for
    # a new prompt, the fewest first; among replicas holding a run, the order's: the
    # conversation's own first).
    held_by, claimed = {}, {}
    for url in urls:
        table = tables.get(url)
        held_by[url] = table.longest(hashes) if table is not None and hashes else 0
        claimed[url] = len(table.kept) if table is not None else 0
    open_ = [
        url for url in urls if loads.get(url, 0) < (2 * cap if held_by[url] >= LONG_RUN else cap)
    ] or list(urls)
    best, best_key, held = open_[0], None, 0
    for order, url in enumerate(open_):
        blocks = held_by[url]
        worth = blocks + (ADAPTER_BLOCKS if url in adapter_on else 0)
        key = (-worth, loads.get(url, 0), 0 if worth else claimed[url], order)
        if best_key is None or key < best_key:
            best, best_key, held = url, key, blocks
    return best, held
