"""A caller's storage: what it holds, its caps, and the one transaction its checks and writes
share so that concurrent requests cannot overshoot them.

A check followed by a write is a race: twenty creates at once all read "19 conversations of
20" and all write. Every write that a cap or the storage quota guards (a conversation made,
items added, a background run admitted) runs its check and its write inside
`caller_transaction(identity)`, where that caller's other such transactions wait:

- on PostgreSQL, a transaction-scoped advisory lock keyed by the caller (released at commit or
  rollback, and by the server if the connection dies, so a crash leaks nothing);
- on SQLite, the site's transactions begin IMMEDIATE (settings): each takes the database's
  write lock at its start, so it runs alone already.

What a caller holds (MSHIP_RESPONSES_QUOTA_BYTES): its live stored responses, its
conversations' items, and their metadata, as JSON bytes. Caps (0: none):
MSHIP_MAX_CONVERSATIONS per caller, MSHIP_MAX_CONVERSATION_ITEMS per conversation,
MSHIP_MAX_BACKGROUND_RUNS running at once per caller.

Blocking (the ORM): called through store.run.
"""

from __future__ import annotations

import contextlib
import zlib
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum, TextField
from django.db.models.functions import Cast, Length
from django.utils import timezone

from openai_api.errors import GatewayError
from openai_api.models import Conversation, ConversationItem, ResponseHeartbeat, StoredResponse

if TYPE_CHECKING:
    from collections.abc import Iterator

RUNNING = ("queued", "in_progress")
# The advisory lock's first key: this kind of lock ("mshq"), apart from the start-up gate's.
LOCK_CLASS = 0x6D736871


@contextlib.contextmanager
def caller_transaction(identity: str) -> Iterator[None]:
    """A transaction in which this caller's capped checks and writes run one at a time."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            key = zlib.crc32(identity.encode()) - 2**31  # a signed 32-bit key
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_CLASS, key])
        yield


def held_bytes(identity: str) -> int:
    """Bytes the caller stores: live responses, conversation items and metadata."""
    live = StoredResponse.objects.filter(identity=identity, expires_at__gt=timezone.now())
    responses = live.aggregate(total=Sum("size"))["total"] or 0
    items = ConversationItem.objects.filter(conversation__identity=identity)
    item_bytes = items.aggregate(total=Sum("size"))["total"] or 0
    metadata = Conversation.objects.filter(identity=identity).aggregate(
        total=Sum(Length(Cast("metadata", output_field=TextField())))
    )
    return int(responses) + int(item_bytes) + int(metadata["total"] or 0)


def check_storage(identity: str, adding: int = 0) -> None:
    """429 storage_quota_exceeded when the caller holds its quota already, or would with
    `adding` more bytes."""
    quota = settings.MSHIP_RESPONSES_QUOTA_BYTES
    if not quota:
        return
    held = held_bytes(identity)
    if held >= quota or held + adding > quota:
        more = f" (and this request adds {adding})" if adding else ""
        raise GatewayError(
            429,
            f"Stored responses and conversations of this caller take {held} bytes{more}, the"
            f" quota is {quota}: delete some (DELETE /v1/responses/{{id}},"
            " /v1/conversations/{id}) or send store: false.",
            "storage_quota_exceeded",
        )


def check_background(identity: str) -> None:
    """429 too_many_background_runs when the caller runs MSHIP_MAX_BACKGROUND_RUNS already
    (runs whose heartbeat is fresh)."""
    limit = settings.MSHIP_MAX_BACKGROUND_RUNS
    if not limit:
        return
    fresh = timezone.now() - timedelta(seconds=settings.MSHIP_RESPONSES_HEARTBEAT_STALE_S)
    beating = ResponseHeartbeat.objects.filter(beat_at__gt=fresh).values("response_id")
    live = StoredResponse.objects.filter(identity=identity, expires_at__gt=timezone.now())
    running = live.filter(status__in=RUNNING, pk__in=beating).count()
    if running >= limit:
        raise GatewayError(
            429,
            f"This caller already runs {running} background responses (at most {limit}).",
            "too_many_background_runs",
            {"retry-after": "5"},
        )


def check_new_conversation(identity: str) -> None:
    cap = settings.MSHIP_MAX_CONVERSATIONS
    if cap and Conversation.objects.filter(identity=identity).count() >= cap:
        raise GatewayError(
            429,
            f"This caller has {cap} conversations, the most it may keep: delete some"
            " (DELETE /v1/conversations/{id}).",
            "too_many_conversations",
        )


def check_items(conversation: Conversation, adding: int) -> None:
    cap = settings.MSHIP_MAX_CONVERSATION_ITEMS
    if not cap or not adding:
        return
    held = conversation.items.count()
    if held + adding > cap:
        raise GatewayError(
            400,
            f"The conversation has {held} items; with {adding} more it would pass its limit of"
            f" {cap}: delete some (DELETE /v1/conversations/{{id}}/items/{{item_id}}) or start"
            " another conversation.",
            "conversation_full",
            param="items",
        )
