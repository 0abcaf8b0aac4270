"""What a request tells the replica choice: its conversation (affinity) and its prefix key.

The gateway reads them from the request it is about to send, and leaves them in `current`
for the dispatcher (the slot is taken further down, by routes that know nothing of them).

- **Conversation**: the caller's session header (`X-Modelship-Session`), else the Responses
  `conversation`, else the stored response it continues (`previous_response_id`), else the
  caller, its `user` and the conversation's opening (its leading system text and first user
  message): every turn of one chat resends that opening. Scoped to the API key, so two
  callers' sessions never meet.
- **Prefix key**: the leading text, whitespace collapsed, up to MSHIP_ROUTING_PREFIX_CHARS:
  a long shared system prompt keys by itself (every conversation under it meets its cached
  KV), a short one keys with the conversation's opening. Scoped to the caller's tenant
  (openai_api/cache_scope.py): one tenant's prefix never leads to another's cache.
- **Blocks**: the prompt as the engine's cache sees it, in chained block hashes seeded with
  the tenant's scope (routing/blocks.py): what the replica and slot choice scores by.

With them, what the route tells the choice: the engine's batch size (the load bound's
floor), the slots the gateway pins a request to (llama.cpp's `parallel`), whether those
slots' caches are kept across a stop (deployments/kv_store.py), and the runtime adapter the
request needs.
"""

from __future__ import annotations

import hashlib
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from django.conf import settings

from openai_api.auth import current_key
from openai_api.cache_scope import tenant_of
from openai_api.routing.blocks import MAX_BLOCKS, block_hashes, layout
from openai_api.routing.blocks import marks as marks_of

if TYPE_CHECKING:
    from openai_api.catalog import Route

SESSION_HEADER: Final = "x-modelship-session"
# Read no further into a request than this for its keys: a 10 MB prompt costs no more.
SCAN_CHARS: Final = 64 * 1024
SCAN_MESSAGES: Final = 64
ID_CHARS: Final = 256  # of a session, conversation, response id or end user
LEADING_ROLES: Final = ("system", "developer")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Hint:
    conversation: str | None = None  # the affinity key, hashed
    prefix: str | None = None  # the consistent hash's key
    # Also remembered with the replica chosen: the response this turn makes, which the next
    # turn names as its previous_response_id.
    also: str | None = None
    owner: str = ""  # the caller's key: every key is scoped to it
    tenant: str = ""  # whose caches it may meet (openai_api/cache_scope.py)
    blocks: tuple[int, ...] = ()  # the prompt's chained block hashes (routing/blocks.py)
    marks: tuple[int, ...] = ()  # its text up to each message's end, hashed (blocks.marks)
    batch: int = 1  # requests its engine batches at once: the load bound's floor
    slots: int = 0  # llama.cpp slots per replica the request is pinned among (0: none)
    keep: bool = False  # its slots' caches are saved at a stop and restored after
    adapter: str = ""  # the runtime adapter it needs (a replica with it loaded scores more)

    @classmethod
    def received(cls, said: dict[str, Any]) -> Hint:
        """A hint as a gateway process sent it to the scheduler's owner, checked: bounded
        strings and numbers, at most MAX_BLOCKS 64-bit hashes (a ValueError otherwise)."""
        texts = {}
        for name in ("conversation", "prefix", "also", "owner", "tenant", "adapter"):
            value = said.get(name)
            if value is not None and not (isinstance(value, str) and len(value) <= 4 * SCAN_CHARS):
                raise ValueError(f"hint {name}: a string")
            texts[name] = value
        blocks, marks = hashes(said, "blocks"), hashes(said, "marks")
        numbers = {}
        for name, most in (("batch", 1 << 16), ("slots", 1 << 10)):
            value = said.get(name, 0)
            if type(value) is not int or not 0 <= value <= most:
                raise ValueError(f"hint {name}: a whole number up to {most}")
            numbers[name] = value
        return cls(
            texts["conversation"],
            texts["prefix"],
            texts["also"],
            owner=texts["owner"] or "",
            tenant=texts["tenant"] or "",
            blocks=blocks,
            marks=marks,
            batch=max(1, numbers["batch"]),
            slots=numbers["slots"],
            keep=said.get("keep") is True,
            adapter=texts["adapter"] or "",
        )


def hashes(said: dict[str, Any], name: str) -> tuple[int, ...]:
    found = said.get(name) or []
    if not isinstance(found, list) or len(found) > MAX_BLOCKS:
        raise ValueError(f"hint {name}: a list of at most {MAX_BLOCKS} hashes")
    if not all(type(b) is int and 0 <= b < 1 << 64 for b in found):
        raise ValueError(f"hint {name}: 64-bit hashes")
    return tuple(found)


current: ContextVar[Hint | None] = ContextVar("modelship_routing_hint", default=None)


def digest(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()


def response_key(owner: str, response_id: str) -> str:
    return digest("response", owner, response_id[:ID_CHARS])


def hint_of(
    data: dict[str, Any] | None,
    headers: dict[str, str],
    owner: str,
    prefix_chars: int,
    tenant: str = "",
    route: Route | None = None,
) -> Hint:
    """The keys of a chat, completions or Responses request (`owner`: the caller's key id,
    or "" for none). Anything the body does not have (an embeddings input) gives no key.
    Every field is cut before it is read whole: this runs on the event loop."""
    data = data or {}
    opening = leading_text(data)
    prefix = scoped(normalised(opening, prefix_chars), tenant) or None
    conversation = None
    if session := headers.get(SESSION_HEADER, "")[:ID_CHARS].strip():
        conversation = digest("session", owner, session)
    elif named := conversation_id(data):
        conversation = digest("conversation", owner, named[:ID_CHARS])
    elif isinstance(previous := data.get("previous_response_id"), str) and previous:
        conversation = response_key(owner, previous)
    elif opening and has_turns(data):
        user = data.get("user") or data.get("safety_identifier")
        user = user[:ID_CHARS] if isinstance(user, str) else ""
        conversation = digest("opening", owner, user, opening)
    blocks, marks = blocks_of(data, block_scope(route, tenant))
    if route is None:
        return Hint(conversation, prefix, owner=owner, tenant=tenant, blocks=blocks, marks=marks)
    adapter = route.name if route.adapter is not None and route.adapter.runtime else ""
    return Hint(
        conversation,
        prefix,
        owner=owner,
        tenant=tenant,
        blocks=blocks,
        marks=marks,
        batch=route.batch,
        slots=route.slots,
        keep=route.keeps_cache,
        adapter=adapter,
    )


def block_scope(route: Route | None, tenant: str) -> str:
    """Whose cache a request's blocks may meet: its tenant's, under the adapter it asks for
    (an adapter's cache is not its base's)."""
    if route is None or route.adapter is None:
        return tenant
    return f"{tenant}\x1fadapter:{route.name}"


def blocks_of(data: dict[str, Any], scope: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A chat, completions or Responses body's blocks and marks, scoped (none for a body
    without a prompt: an embeddings input is not a cache's)."""
    if any(isinstance(data.get(name), list | str) for name in ("messages", "input", "prompt")):
        text, ends = layout(data)
        return block_hashes(text, scope), marks_of(text, ends, scope)
    return (), ()


def scoped(prefix: str, tenant: str) -> str:
    """A prefix key within its tenant's: one tenant's prefix never leads to another's cache."""
    return f"{tenant}\x1f{prefix}" if prefix and tenant else prefix


def normalised(text: str, length: int) -> str:
    """Whitespace collapsed, cut at `length` (a run of spaces counts as one: cut late)."""
    return _SPACE.sub(" ", text[: max(0, length) * 4]).strip()[: max(0, length)]


def note(route: Route, data: dict[str, Any] | None, headers: dict[str, str], owner: str) -> None:
    """Leave the request's keys for the dispatcher, where there is a choice to make (a route
    with several replicas, an on-demand one whose replicas are not known yet, or one whose
    engine's slots the gateway chooses)."""
    if len(route.urls) != 1 or route.slots:
        tenant = tenant_of(current_key.get())
        chars = settings.MSHIP_ROUTING_PREFIX_CHARS
        current.set(hint_of(data, headers, owner, chars, tenant, route))


def conversation_id(data: dict[str, Any]) -> str:
    named = data.get("conversation")
    if isinstance(named, dict):
        named = named.get("id")
    return named if isinstance(named, str) else ""


def has_turns(data: dict[str, Any]) -> bool:
    """Whether the request is a turn of something longer (chat messages, Responses input);
    a completions prompt is a conversation of one."""
    return isinstance(data.get("messages"), list) or "input" in data


def leading_text(data: dict[str, Any]) -> str:
    """The leading system (or developer, or Responses instructions) text, then the first user
    message's, up to SCAN_CHARS."""
    parts: list[str] = []
    if isinstance(instructions := data.get("instructions"), str):
        parts.append(instructions[:SCAN_CHARS])
    messages = data.get("messages")
    if messages is None:
        messages = data.get("input")
    if isinstance(messages, str):
        parts.append(messages[:SCAN_CHARS])
    elif isinstance(messages, list):
        length = 0
        for message in messages[:SCAN_MESSAGES]:
            if not isinstance(message, dict):
                break
            parts.append(text_of(message.get("content")))
            length += len(parts[-1])
            if message.get("role") not in LEADING_ROLES or length >= SCAN_CHARS:
                break  # the first user message closes the opening
    elif isinstance(prompt := data.get("prompt"), str):
        parts.append(prompt[:SCAN_CHARS])
    return "\n".join(parts)[:SCAN_CHARS]


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a list (images and audio count not)."""
    if isinstance(content, str):
        return content[:SCAN_CHARS]
    if isinstance(content, list):
        texts = [
            part["text"][:SCAN_CHARS]
            for part in content[:SCAN_MESSAGES]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)[:SCAN_CHARS]
    return ""
