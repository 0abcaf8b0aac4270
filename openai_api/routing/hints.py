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
    return Hint(conversation, prefix, owner=owner, tenant=tenant)


def scoped(prefix: str, tenant: str) -> str:
    """A prefix key within its tenant's: one tenant's prefix never leads to another's cache."""
    return f"{tenant}\x1f{prefix}" if prefix and tenant else prefix


def normalised(text: str, length: int) -> str:
    """Whitespace collapsed, cut at `length` (a run of spaces counts as one: cut late)."""
    return _SPACE.sub(" ", text[: max(0, length) * 4]).strip()[: max(0, length)]


def note(route: Route, data: dict[str, Any] | None, headers: dict[str, str], owner: str) -> None:
    """Leave the request's keys for the dispatcher, where there is a choice to make (a route
    with several replicas, or an on-demand one whose replicas are not known yet)."""
    if len(route.urls) != 1:
        tenant = tenant_of(current_key.get())
        current.set(hint_of(data, headers, owner, settings.MSHIP_ROUTING_PREFIX_CHARS, tenant))


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
