"""Stored responses: one snapshot per response id, scoped by the caller's identity.

Blocking (the ORM): the gateway calls these in threads, before the engine is called (the
history) and after its last chunk, before the terminal event goes out (the write). A store
that cannot be reached is 503 `store_unavailable`, before any engine work."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from common.db_calls import off_loop
from openai_api.errors import GatewayError
from openai_api.models import ResponseHeartbeat, StoredResponse
from openai_api.responses import compaction, conversations, quotas
from openai_api.responses.input_items import check_tool_outputs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from openai_api.responses.protocol import ResponsesRequest

# A stored response's status (the Responses API's words): still running, or ended.
RUNNING = ("queued", "in_progress")


def unavailable(exc: Exception) -> GatewayError:
    return GatewayError(
        503, f"The response store cannot be reached: {exc.__class__.__name__}.", "store_unavailable"
    )


def not_found(response_id: str) -> GatewayError:
    return GatewayError(
        404, f"No response with id {response_id!r} was found.", "not_found", param="response_id"
    )


async def run(fn: Any, *args: Any) -> Any:
    """A store call in a thread, its database failures turned into 503."""

    try:
        return await off_loop(fn, *args)
    except DatabaseError as exc:
        raise unavailable(exc) from exc


def _live(identity: str, response_id: str) -> StoredResponse | None:
    return StoredResponse.objects.filter(
        pk=response_id, identity=identity, expires_at__gt=timezone.now()
    ).first()


def get(identity: str, response_id: str) -> StoredResponse:
    stored = _live(identity, response_id)
    if stored is None:
        raise not_found(response_id)
    return stored


def model_of(identity: str, response_id: str) -> str | None:
    """The model a caller's stored response was made with; None when there is none."""
    stored = _live(identity, response_id)
    return stored.model if stored is not None else None


def history(identity: str, response_id: str) -> list[dict[str, Any]]:
    """The items a continuation of `response_id` starts from: its conversation and its
    output."""
    stored = get(identity, response_id)
    return [*stored.conversation, *stored.response.get("output", [])]


async def earlier_items(
    identity: str,
    request: ResponsesRequest,
    known: Mapping[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The items a request continues from (its conversation's items, or its previous
    response's conversation and output), its function call outputs checked against them
    and its own calls, and every compaction item checked as the caller's. `known`:
    continuations a WebSocket holds in memory (responses made on it, stored or not), looked
    up before the store."""
    items: list[dict[str, Any]] = []
    previous = request.previous_response_id
    if request.conversation:
        items = await run(conversations.items_of, identity, request.conversation)
        cap = settings.MSHIP_MAX_CONVERSATION_ITEMS
        if cap and len(items) >= cap:  # the turn would add its input and output
            raise GatewayError(
                400,
                f"The conversation has {len(items)} items, its limit: delete some or start"
                " another conversation.",
                "conversation_full",
                param="conversation",
            )
    elif previous and known is not None and previous in known:
        items = list(known[previous])
    elif previous:
        items = await run(history, identity, previous)
    check_tool_outputs(items, request.input_items)
    earlier = "conversation" if request.conversation else "previous_response_id"
    compaction.check(identity, items, earlier)
    compaction.check(identity, request.input_items)
    return items


def save(identity: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
    expires = timezone.now() + timedelta(seconds=settings.MSHIP_RESPONSES_TTL_S)
    size = len(json.dumps(response)) + len(json.dumps(conversation))
    StoredResponse.objects.update_or_create(
        pk=response["id"],
        defaults={
            "identity": identity,
            "model": response["model"],
            "status": response["status"],
            "response": response,
            "conversation": conversation,
            "size": size,
            "expires_at": expires,
        },
    )


def save_turn(
    identity: str,
    request: ResponsesRequest,
    response: dict[str, Any],
    context: list[dict[str, Any]],
) -> None:
    """A foreground response at its end: stored where the request asked, and a completed
    one's input and output added to its conversation, together."""
    with transaction.atomic():
        if request.store:
            save(identity, response, context)
        extend_conversation(identity, request, response)


def extend_conversation(identity: str, request: ResponsesRequest, response: dict[str, Any]) -> None:
    if request.conversation and response["status"] in ("completed", "incomplete"):
        items = [*request.input_items, *response.get("output", [])]
        conversations.append(identity, request.conversation, items)


def check_quota(identity: str, background: bool) -> None:
    """429 before any engine work when the caller already stores MSHIP_RESPONSES_QUOTA_BYTES
    or, for a background run, already runs MSHIP_MAX_BACKGROUND_RUNS."""
    quotas.check_storage(identity)
    if background:
        quotas.check_background(identity)


def admit_background(
    identity: str, response: dict[str, Any], context: list[dict[str, Any]]
) -> None:
    """A background run's first write (queued, its first beat), made only while the caller
    is within its quota and its running cap, checked again with the write alone among the
    caller's (quotas.caller_transaction): a burst of creates cannot all pass the earlier check
    and all run."""
    with quotas.caller_transaction(identity):
        check_quota(identity, background=True)
        save(identity, response, context)
        beat(response["id"])


def delete(identity: str, response_id: str) -> None:
    deleted, _ = StoredResponse.objects.filter(pk=response_id, identity=identity).delete()
    if not deleted:
        raise not_found(response_id)


def input_items(
    identity: str, response_id: str, order: str, after: str | None, limit: int
) -> dict[str, Any]:
    items = list(get(identity, response_id).conversation)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise GatewayError(
                400,
                f"{after!r} is not an input item of this response.",
                "invalid_request",
                param="after",
            )
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def sweep() -> int:
    """Delete expired responses; returns how many."""
    deleted, _ = StoredResponse.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted


TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def save_if_running(identity: str, request: ResponsesRequest, response: dict[str, Any]) -> bool:
    """A background run's write: only while nobody ended it first (a cancel, a poll that
    found it lost), so a late write never brings a finished response back. The write that
    completes it adds its input and output to its conversation."""
    with transaction.atomic():
        updated = StoredResponse.objects.filter(
            pk=response["id"], identity=identity, status__in=RUNNING
        ).update(status=response["status"], response=response)
        if updated:
            extend_conversation(identity, request, response)
    return bool(updated)


def end_if_running(
    identity: str, response_id: str, status: str, error: dict[str, str] | None = None
) -> dict[str, Any]:
    """Move a running response to `status` (cancelled, failed) unless it already ended;
    returns the response as it now stands."""
    stored = get(identity, response_id)
    if stored.status in RUNNING:
        response = {**stored.response, "status": status}
        if error is not None:
            response["error"] = error
        updated = StoredResponse.objects.filter(pk=response_id, status__in=RUNNING).update(
            status=status, response=response
        )
        if updated:
            return response
        stored = get(identity, response_id)
    return dict(stored.response)


def beat(response_id: str) -> str | None:
    """A background run's heartbeat; returns its stored status (a cancel made through
    another process shows here), None when it is gone."""
    ResponseHeartbeat.objects.update_or_create(
        response_id=response_id, defaults={"beat_at": timezone.now()}
    )
    row = StoredResponse.objects.filter(pk=response_id).values_list("status", flat=True)
    return row.first()


def last_beat(response_id: str) -> Any:
    row = ResponseHeartbeat.objects.filter(response_id=response_id).first()
    return None if row is None else row.beat_at


def forget_beat(response_id: str) -> None:
    ResponseHeartbeat.objects.filter(response_id=response_id).delete()
