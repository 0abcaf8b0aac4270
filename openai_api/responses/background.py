"""Background runs (`background: true`): answered `queued` at once, generated detached on
the gateway process, polled, cancelled, and (with `stream: true`) streamed from a replay
log that a client can resume from any sequence number.

The run keeps a heartbeat apart from its snapshot; a poll that finds a running snapshot
with no recent beat (its process died) reports it failed. Every write of the run is
conditional on the snapshot still running, so a cancel or that verdict is never undone.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from openai_api import access
from openai_api.errors import GatewayError
from openai_api.forwarder import cancel_on_hangup, sse_start
from openai_api.responses import store
from openai_api.responses.engine_turn import conclude
from openai_api.responses.replay import ReplayLog, replay_log, tail
from openai_api.responses.respond import respond
from openai_api.responses.run_notices import notices
from openai_api.responses.translator import DONE, Event, sse
from openai_api.usage.budgets import budgets

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from openai_api.exchange import Exchange
    from openai_api.responses.turn import Turn
    from openai_api.usage.budgets import Reservation

log = logging.getLogger(__name__)
_runs: dict[str, asyncio.Task[None]] = {}  # this process's live runs, by response id


async def start(exchange: Exchange, turn: Turn) -> None:
    translator, identity = turn.translator, turn.identity
    response = translator.response
    rid = response["id"]
    opening = translator.start(created_status="queued")
    queued = {**copy.deepcopy(response), "status": "queued"}
    # Everything the run needs is checked before the engine is called: a store or a log
    # that cannot be reached is a 503 now.
    await store.run(store.admit_background, identity, queued, turn.context)
    replay = replay_log() if turn.request.stream else None
    if replay is not None:
        try:
            await replay.append(rid, opening)
        except GatewayError:
            await store.run(
                store.end_if_running, identity, rid, "failed", _error("store_unavailable")
            )
            raise
    # The POST counts as the request; the run's tokens and GPU-seconds are the run's own
    # record's (it ends after the POST's), not read from what the POST sends.
    exchange.record.reported = (0, 0, 0)
    # Its tokens are the run's: the POST's reservation goes with it, held until it ends.
    held, exchange.record.reservation = exchange.record.reservation, None
    task = asyncio.ensure_future(_run(turn, replay, exchange.request_id, exchange.record, held))
    if held is not None:
        task.add_done_callback(lambda _: budgets.release(held))  # once, however it ended
    _runs[rid] = task
    notices.listen(_cancel_here)
    task.add_done_callback(lambda _: _runs.pop(rid, None))
    if replay is None:
        return await exchange.json(200, json.dumps(queued).encode())
    await stream_out(exchange, tail(replay, rid, -1, lambda: finished(identity, rid)))


def _error(code: str, message: str = "") -> dict[str, str]:
    return {"code": code, "message": message or code.replace("_", " ")}


async def _run(
    turn: Turn,
    replay: ReplayLog | None,
    request_id: str,
    began: access.RequestRecord,
    held: Reservation | None = None,
) -> None:
    """The run, counted apart from the POST that queued it: its usage, its GPU-seconds, the
    tokens its budgets hold for it."""
    with access.counted_apart(
        request_id, gateway="background", like=began, counts_request=False
    ) as record:
        record.reservation = held
        record.status = 200
        await _respond(turn, replay, request_id)
        access.note_usage(turn.translator.response.get("usage"))
        if turn.translator.response.get("status") not in ("completed", "incomplete"):
            record.status = 502


async def _respond(turn: Turn, replay: ReplayLog | None, request_id: str) -> None:
    translator, identity, request = turn.translator, turn.identity, turn.request
    rid = translator.response["id"]

    async def emit(events: list[Event]) -> None:
        if replay is not None and events:
            await replay.append(rid, events)

    async def save(finished_response: dict[str, Any]) -> None:
        await store.run(store.save_if_running, identity, request, finished_response)

    beat = asyncio.ensure_future(_heartbeat(rid, asyncio.current_task()))
    try:
        await save(copy.deepcopy(translator.response))  # in_progress
        try:
            answered = await respond(
                turn.route, request, turn.history, translator, emit, request_id
            )
        except GatewayError as exc:  # refused before the engine answered
            await emit(translator.fail(exc.code, exc.message))
            await save(translator.response)
            return
        if answered:
            await conclude(translator, emit, save)
        else:
            await save(translator.response)
    except asyncio.CancelledError:
        pass  # cancelled: whoever cancelled it wrote its status
    except Exception as exc:
        log.exception("background response %s failed", rid)
        with contextlib.suppress(Exception):
            await store.run(
                store.end_if_running, identity, rid, "failed", _error("server_error", str(exc))
            )
    finally:
        beat.cancel()
        with contextlib.suppress(Exception):
            await store.run(store.forget_beat, rid)
        if replay is not None:
            with contextlib.suppress(Exception):
                await replay.ended(rid)


async def _heartbeat(rid: str, run: asyncio.Task[Any] | None) -> None:
    while True:
        with contextlib.suppress(GatewayError):
            # Only a cancel stops the run from here: a run that ended by itself still has
            # its last events to write.
            if await store.run(store.beat, rid) == "cancelled" and run is not None:
                run.cancel()
        await asyncio.sleep(settings.MSHIP_RESPONSES_HEARTBEAT_S)


def _cancel_here(response_id: str) -> None:
    task = _runs.get(response_id)
    if task is not None:
        task.cancel()  # closes the engine request, as a client hang-up does


def _lost(stored: Any) -> bool:
    """A running background snapshot whose run no longer beats."""
    if stored.status not in store.RUNNING or stored.id in _runs:
        return False
    last = store.last_beat(stored.id) or stored.created
    stale = timedelta(seconds=settings.MSHIP_RESPONSES_HEARTBEAT_STALE_S)
    return bool(timezone.now() - last > stale)


def poll(identity: str, response_id: str) -> dict[str, Any]:
    """A retrieve: the snapshot, or `failed` when its run was lost (blocking)."""
    stored = store.get(identity, response_id)
    if stored.response.get("background") and _lost(stored):
        message = "The background run stopped without finishing (its process went away)."
        return store.end_if_running(
            identity, response_id, "failed", _error("background_run_lost", message)
        )
    return dict(stored.response)


async def finished(identity: str, response_id: str) -> bool:
    response = await store.run(poll, identity, response_id)
    return response["status"] in store.TERMINAL


async def cancel(identity: str, response_id: str) -> dict[str, Any]:
    stored = await store.run(store.get, identity, response_id)
    if not stored.response.get("background"):
        raise GatewayError(400, "Only a background response can be cancelled.", "invalid_request")
    response: dict[str, Any] = await store.run(
        store.end_if_running, identity, response_id, "cancelled"
    )
    if response["status"] == "cancelled":
        if response_id in _runs:
            _cancel_here(response_id)
        else:
            await notices.cancelled(response_id)  # the run is another process's
    return response


async def resume(exchange: Exchange, identity: str, response_id: str, after: int) -> None:
    stored = await store.run(store.get, identity, response_id)
    replay = replay_log()
    if not stored.response.get("background") or not await replay.exists(response_id):
        raise GatewayError(
            400,
            "This response has no stream to resume (not a streamed background run, or its"
            " log expired).",
            "invalid_request",
        )
    await stream_out(
        exchange, tail(replay, response_id, after, lambda: finished(identity, response_id))
    )


async def drop(identity: str, response_id: str) -> None:
    """Before a delete: a running background run is cancelled and its log dropped."""
    with contextlib.suppress(GatewayError):
        stored = await store.run(store.get, identity, response_id)
        if stored.response.get("background") and stored.status in store.RUNNING:
            await cancel(identity, response_id)
        with contextlib.suppress(GatewayError):
            await replay_log().drop(response_id)


async def stream_out(exchange: Exchange, events: AsyncIterator[Event]) -> None:
    """Tail events to the client as SSE; its hang-up ends the tail, never the run."""
    async with cancel_on_hangup(exchange):
        await exchange.send(sse_start(exchange.request_id))
        async for event in events:
            await exchange.send(
                {"type": "http.response.body", "body": sse(event), "more_body": True}
            )
        await exchange.send({"type": "http.response.body", "body": DONE})
