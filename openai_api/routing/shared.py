"""Routing state shared by the gateway processes through Redis (where REDIS_URL is set).

A thread of each process, every MSHIP_ROUTING_SYNC_S: publishes this process's outstanding
requests per replica (a hash of its own that expires unless renewed, so a process that died
stops counting within seconds), reads the other processes' hashes, and writes the
conversations this process placed since (`modelship:routing:affinity:{key}`, expiring with
MSHIP_ROUTING_AFFINITY_S). A conversation this process has not seen is read from Redis on
its turn (one GET, bounded by LOOKUP_TIMEOUT_S); Redis down, each process routes on its own
counts and table, which is what it does without Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any, Final

from django.conf import settings

from common.redis_errors import with_redis_errors

if TYPE_CHECKING:
    from openai_api.routing.affinity import Affinity

log = logging.getLogger(__name__)
PROCESSES: Final = "modelship:routing:processes"
LOOKUP_TIMEOUT_S: Final = 0.05
ME: Final = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def load_key(process: str) -> str:
    return f"modelship:routing:load:{process}"


def affinity_key(key: str) -> str:
    return f"modelship:routing:affinity:{key}"


class Shared:
    def __init__(self, local: dict[str, int], affinity: Affinity) -> None:
        self.local = local  # this process's outstanding per replica (the dispatcher's)
        self.affinity = affinity
        self.remote: dict[str, int] = {}  # the other processes', summed
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.client: Any = None
        self.client_url = ""
        # Whether Redis answered the last sync: while it does not, a conversation this
        # process has not seen is not looked up (no request waits on a Redis that is gone).
        self.healthy = True
        self.failing = False  # the sync thread's own view, for its log
        self.clients: dict[tuple[asyncio.AbstractEventLoop, str], Any] = {}

    @staticmethod
    def configured() -> bool:
        return bool(settings.REDIS_URL)

    def start(self) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.stop.clear()
                self.thread = threading.Thread(
                    target=self.run, name="modelship-routing", daemon=True
                )
                self.thread.start()

    def close(self) -> None:
        self.stop.set()
        thread = self.thread
        if thread is not None:
            thread.join(5)
        self.thread = None
        self.remote = {}

    def run(self) -> None:
        while not self.stop.wait(max(0.05, settings.MSHIP_ROUTING_SYNC_S)):
            if not self.configured():
                self.remote = {}
                continue
            try:
                self.sync_once()
            except Exception:  # never the thread's end: routing goes on on local counts
                log.exception("routing counts not shared")
                self.remote, self.healthy = {}, False
        if self.configured():
            self.withdraw()

    def sync_once(self) -> None:
        mine = {url: n for url, n in self.local.copy().items() if n > 0}
        placed = self.affinity.take_unshared()
        ttl = max(1, round(settings.MSHIP_ROUTING_AFFINITY_S))
        expiry = max(2, round(10 * settings.MSHIP_ROUTING_SYNC_S))
        try:
            client = self.sync_client()
            pipe = client.pipeline(transaction=False)
            pipe.delete(load_key(ME))
            if mine:
                pipe.hset(load_key(ME), mapping=mine)
                pipe.expire(load_key(ME), expiry)
            pipe.sadd(PROCESSES, ME)
            for key, url in placed:
                pipe.set(affinity_key(key), url, ex=ttl)
            pipe.smembers(PROCESSES)
            others = sorted(p.decode() for p in pipe.execute()[-1] if p.decode() != ME)
            pipe = client.pipeline(transaction=False)
            for process in others:
                pipe.hgetall(load_key(process))
            answers = pipe.execute()
        except with_redis_errors(OSError) as exc:
            if not self.failing:  # once a failure, not four times a second
                log.warning("routing counts not shared through Redis: %s", exc)
            self.drop_client()
            self.remote, self.healthy, self.failing = {}, False, True
            return
        if self.failing:
            log.info("routing counts shared through Redis again")
        self.healthy, self.failing = True, False
        remote: dict[str, int] = {}
        gone = []
        for process, counts in zip(others, answers, strict=True):
            if not counts:
                gone.append(process)  # expired: that process stopped or lost Redis
            for url, n in counts.items():
                remote[url.decode()] = remote.get(url.decode(), 0) + int(n)
        self.remote = remote
        if gone:
            try:
                client.srem(PROCESSES, *gone)
            except with_redis_errors(OSError):
                pass

    def withdraw(self) -> None:
        """A clean stop: this process's counts go at once rather than on expiry."""
        try:
            client = self.sync_client()
            client.delete(load_key(ME))
            client.srem(PROCESSES, ME)
        except with_redis_errors(OSError):
            pass

    def sync_client(self) -> Any:
        if self.client is None or self.client_url != settings.REDIS_URL:
            from redis import Redis  # noqa: PLC0415 - only where Redis is set

            self.drop_client()
            self.client_url = settings.REDIS_URL
            self.client = Redis.from_url(self.client_url, socket_timeout=2)
        return self.client

    def drop_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    async def lookup(self, key: str) -> str | None:
        """The replica another process placed this conversation on, if Redis answers soon."""
        where = (asyncio.get_running_loop(), settings.REDIS_URL)
        client = self.clients.get(where)
        try:
            if client is None:
                from redis import asyncio as aioredis  # noqa: PLC0415 - only where Redis is set

                client = self.clients[where] = aioredis.from_url(where[1])
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                found = await client.get(affinity_key(key))
        except with_redis_errors(OSError, TimeoutError):
            self.healthy = False  # no more lookups until the sync thread reaches Redis
            return None
        return found.decode() if isinstance(found, bytes) else None
