"""Conversations: items kept per caller that responses made in the conversation read as
their context and extend with their input and output once they complete.

Blocking (the ORM), called through `store.run` like the response store: a store that cannot
be reached is a 503 before any engine work. Another caller's conversation is simply not
found."""

from __future__ import annotations

import json
from typing import Any

from django.db import IntegrityError, transaction

from openai_api.errors import GatewayError
from openai_api.models import Conversation, ConversationItem
from openai_api.responses.fields import bad, new_id
from openai_api.responses.quotas import (
    caller_transaction,
    check_items,
    check_new_conversation,
    check_storage,
)

MAX_ITEMS_PER_ADD = 20  # OpenAI's limit for one create or add


def not_found(conversation_id: str) -> GatewayError:
    return GatewayError(
        404,
        f"No conversation with id {conversation_id!r} was found.",
        "not_found",
        param="conversation_id",
    )


def item_not_found(conversation_id: str, item_id: str) -> GatewayError:
    return GatewayError(
        404,
        f"No item with id {item_id!r} in conversation {conversation_id!r}.",
        "not_found",
        param="item_id",
    )


def public(conversation: Conversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": int(conversation.created.timestamp()),
        "metadata": conversation.metadata,
    }


def get(identity: str, conversation_id: str) -> Conversation:
    conversation = Conversation.objects.filter(pk=conversation_id, identity=identity).first()
    if conversation is None:
        raise not_found(conversation_id)
    return conversation


def public_of(identity: str, conversation_id: str) -> dict[str, Any]:
    return public(get(identity, conversation_id))


def create(identity: str, metadata: dict[str, str], items: list[dict[str, Any]]) -> dict[str, Any]:
    _check_count(items)
    # The caps and the quota checked with the write, alone among this caller's (quotas.py).
    with caller_transaction(identity):
        check_new_conversation(identity)
        conversation = Conversation(id=new_id("conv"), identity=identity, metadata=metadata)
        check_items(conversation, len(items))
        rows, _ = _rows(conversation, items, skip_known=False, known=set())
        check_storage(identity, metadata_size(metadata) + sum(row.size for row in rows))
        conversation.save(force_insert=True)
        _write(rows)
    return public(conversation)


def update(identity: str, conversation_id: str, metadata: dict[str, str]) -> dict[str, Any]:
    with caller_transaction(identity):
        conversation = get(identity, conversation_id)
        check_storage(identity, metadata_size(metadata) - metadata_size(conversation.metadata))
        conversation.metadata = metadata
        conversation.save(update_fields=["metadata"])
    return public(conversation)


def metadata_size(metadata: dict[str, str]) -> int:
    """Metadata's bytes as the quota counts them (its JSON text in the database)."""
    return len(json.dumps(metadata)) if metadata else 2


def delete(identity: str, conversation_id: str) -> dict[str, Any]:
    deleted, _ = Conversation.objects.filter(pk=conversation_id, identity=identity).delete()
    if not deleted:
        raise not_found(conversation_id)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def items_of(identity: str, conversation_id: str) -> list[dict[str, Any]]:
    """Every item, in order: the context of a response made in the conversation."""
    conversation = get(identity, conversation_id)
    return list(conversation.items.values_list("item", flat=True))


def add_items(identity: str, conversation_id: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """POST .../items: the items added, as a list page."""
    _check_count(items)
    with caller_transaction(identity):
        conversation = get(identity, conversation_id)
        check_items(conversation, len(items))
        known = set(conversation.items.values_list("item_id", flat=True))
        rows, added = _rows(conversation, items, skip_known=False, known=known)
        check_storage(identity, sum(row.size for row in rows))
        _write(rows)
    return _page(added, has_more=False)


def append(identity: str, conversation_id: str, items: list[dict[str, Any]]) -> None:
    """A completed response's input and output, added to its conversation. An item the
    conversation already holds (an earlier output passed back as input) is not added twice.

    Not refused by the caps or the quota: the response has run, and a conversation missing
    its turn would mislead the next one. Its start checked both (store.check_quota,
    store.earlier_items), so a turn goes past them by its own items at most."""
    with transaction.atomic():
        conversation = Conversation.objects.filter(pk=conversation_id, identity=identity).first()
        if conversation is not None:  # deleted while the response ran: nothing to extend
            known = set(conversation.items.values_list("item_id", flat=True))
            _write(_rows(conversation, items, skip_known=True, known=known)[0])


def _check_count(items: list[dict[str, Any]]) -> None:
    if len(items) > MAX_ITEMS_PER_ADD:
        raise bad(f"At most {MAX_ITEMS_PER_ADD} items can be added at once.", "items")


def _rows(
    conversation: Conversation, items: list[dict[str, Any]], skip_known: bool, known: set[str]
) -> tuple[list[ConversationItem], list[dict[str, Any]]]:
    """The rows to add (each item given an id) and the items as added; `known`: the ids the
    conversation holds."""
    rows, added = [], []
    for item in items:
        item_id = str(item.get("id") or new_id("item"))
        if item_id in known:
            if skip_known:
                continue
            raise bad(f"The conversation already has an item {item_id!r}.", "items")
        known.add(item_id)
        item = {**item, "id": item_id}
        rows.append(
            ConversationItem(
                conversation=conversation,
                item_id=item_id,
                item=item,
                size=len(json.dumps(item)),
            )
        )
        added.append(item)
    return rows, added


def _write(rows: list[ConversationItem]) -> None:
    try:
        ConversationItem.objects.bulk_create(rows)
    except IntegrityError as exc:  # a concurrent add of the same id
        raise bad("The conversation already has one of these items.", "items") from exc


def item(identity: str, conversation_id: str, item_id: str) -> dict[str, Any]:
    found = get(identity, conversation_id).items.filter(item_id=item_id).first()
    if found is None:
        raise item_not_found(conversation_id, item_id)
    return dict(found.item)


def delete_item(identity: str, conversation_id: str, item_id: str) -> dict[str, Any]:
    conversation = get(identity, conversation_id)
    deleted, _ = conversation.items.filter(item_id=item_id).delete()
    if not deleted:
        raise item_not_found(conversation_id, item_id)
    return public(conversation)


def list_items(
    identity: str, conversation_id: str, order: str, after: str | None, limit: int
) -> dict[str, Any]:
    """GET .../items: a page of `limit` items after the item `after`, in `order`."""
    rows = get(identity, conversation_id).items.all()
    rows = rows.order_by("id" if order == "asc" else "-id")
    if after is not None:
        anchor = rows.filter(item_id=after).values_list("id", flat=True).first()
        if anchor is None:
            raise bad(f"{after!r} is not an item of this conversation.", "after")
        rows = rows.filter(id__gt=anchor) if order == "asc" else rows.filter(id__lt=anchor)
    page = [row.item for row in rows[: limit + 1]]
    return _page(page[:limit], has_more=len(page) > limit)


def _page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }
