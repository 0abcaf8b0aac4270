"""The live admin's WebSocket (/ws/deployments): the deployment list and each deployment's
page subscribe to it and update without a reload.

Two sources, so that it works on any channel layer. A watcher per event loop reads every
deployment's row once a second while a page watches (ondemand/live_rows.py): a change made
in any process (a start in the django-q cluster, a stop by `manage.py`) shows within a second
even on the in-memory layer of `make run`. And the "deployments" group: a gateway's on-demand
counts (ondemand/counters.py) and a state change (published by the transition, across
processes where the layer is Redis) arrive at once. Each page gets at most one message a
second per deployment (and for the host panel); later changes fold into the next."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.db import transaction

from ondemand.count_sums import CountSums
from ondemand.counters import EVERY_S, GROUP, CounterPublisher
from ondemand.live_rows import Row, for_viewer, snapshot, with_counts

log = logging.getLogger(__name__)
HOST = 0  # the host panel's key among the deployments' ids (which start at 1)
MIN_GAP_S = 0.25  # the watcher reads at most this often, however many changes poke it
PERMISSION = "deployments.view_deployment"
EVENTS_PERMISSION = "deployments.view_deploymentevent"


class Watcher:
    """Reads the rows while consumers watch, and hands each what changed."""

    def __init__(self) -> None:
        self.consumers: set[LiveDeployments] = set()
        self.rows: dict[int, Row] = {}
        self.host: dict[str, Any] | None = None
        self.poked = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def subscribe(self, consumer: LiveDeployments) -> None:
        self.consumers.add(consumer)
        if not self.rows:  # what the first page was just sent is what changes are told from
            self.rows, self.host = dict(consumer.rows), consumer.host
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self.run())

    def unsubscribe(self, consumer: LiveDeployments) -> None:
        self.consumers.discard(consumer)
        if not self.consumers and self.task is not None:
            self.task.cancel()
            self.task, self.rows, self.host = None, {}, None

    def poke(self) -> None:
        self.poked.set()

    async def run(self) -> None:
        while self.consumers:
            self.poked.clear()
            try:
                rows, host = await database_sync_to_async(snapshot)()
            except Exception:
                log.exception("the live admin could not read the deployments")
            else:
                self.hand_over(rows, host)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.poked.wait(), EVERY_S)
            if self.poked.is_set():
                await asyncio.sleep(MIN_GAP_S)

    def hand_over(self, rows: dict[int, Row], host: dict[str, Any]) -> None:
        changed = [row for pk, row in rows.items() if self.rows.get(pk) != row]
        gone = [pk for pk in self.rows if pk not in rows]
        host_changed = host != self.host
        self.rows, self.host = rows, host
        for consumer in list(self.consumers):
            for row in changed:
                consumer.row_changed(row)
            for pk in gone:
                consumer.row_gone(pk)
            if host_changed:
                consumer.host_changed(host)


_watchers: dict[asyncio.AbstractEventLoop, Watcher] = {}


def watcher() -> Watcher:
    loop = asyncio.get_running_loop()
    if loop not in _watchers:
        _watchers[loop] = Watcher()
    return _watchers[loop]


def may_watch(user: Any) -> bool:
    return bool(user and user.is_active and user.is_staff and user.has_perm(PERMISSION))


def may_see_events(user: Any) -> bool:
    """The dashboard's last failures are deployment events: shown to those who may view
    them (as /api/events/ is)."""
    return bool(may_watch(user) and user.has_perm(EVENTS_PERMISSION))


class LiveDeployments(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Sends {"type": "snapshot", "rows", "host"} on connect, then {"type": "row", "row"},
    {"type": "gone", "id"} and {"type": "host", "host"} as things change. A staff user with
    view permission on deployments only (the admin's session); others are refused."""

    groups = [GROUP]

    async def connect(self) -> None:
        self.rows: dict[int, Row] = {}
        self.host: dict[str, Any] = {}
        self.sees_events = False
        self.sender = CounterPublisher(self.send_latest)
        self.counts = CountSums()
        user = self.scope.get("user")
        if not await database_sync_to_async(may_watch)(user):
            await self.close(code=4403)
            return
        self.sees_events = await database_sync_to_async(may_see_events)(user)
        await self.accept()
        self.rows, host = await database_sync_to_async(snapshot)()
        self.host = for_viewer(host, self.sees_events)
        await self.send_json(
            {"type": "snapshot", "rows": list(self.rows.values()), "host": self.host}
        )
        watcher().subscribe(self)

    async def disconnect(self, code: int) -> None:
        watcher().unsubscribe(self)
        for task in list(self.sender.pending.values()):
            task.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        return  # the pages send nothing; whatever a client sends is ignored

    # From the watcher.
    def row_changed(self, row: Row) -> None:
        summed = self.counts.summed(row["id"])
        self.rows[row["id"]] = row if summed is None else with_counts(row, summed)
        self.sender.changed(row["id"])

    def row_gone(self, pk: int) -> None:
        if self.rows.pop(pk, None) is not None:
            self.sender.changed(pk)

    def host_changed(self, host: dict[str, Any]) -> None:
        self.host = for_viewer(host, self.sees_events)
        self.sender.changed(HOST)

    async def send_latest(self, key: int) -> None:
        if key == HOST:
            await self.send_json({"type": "host", "host": self.host})
        elif key in self.rows:
            await self.send_json({"type": "row", "row": self.rows[key]})
        else:
            await self.send_json({"type": "gone", "id": key})

    # From the group.
    async def deployment_ondemand(self, event: dict[str, Any]) -> None:
        pk = event["id"]
        if pk in self.rows and event.get("ondemand"):
            self.counts.add(pk, event["ondemand"])  # one gateway process's counts
            self.row_changed(self.rows[pk])

    async def deployment_state(self, event: dict[str, Any]) -> None:
        watcher().poke()


def publish_state_change(deployment_id: int) -> None:
    """A transition's hook: tell the group once the change is committed (a page that reads
    the row before then would see the old state). Best effort: the watcher reads it anyway."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(
                GROUP, {"type": "deployment.state", "id": deployment_id}
            )
        except Exception:
            log.debug("the state change of %s was not published", deployment_id, exc_info=True)

    transaction.on_commit(send)
