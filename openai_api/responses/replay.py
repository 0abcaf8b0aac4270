"""The replay log of a streamed background run: every event, in order, for the first POST
and for clients that resume with `GET /v1/responses/{id}?stream=true&starting_after=N`.

Redis Streams where REDIS_URL is set (one stream per response), else a database table. A
log lives MSHIP_RESPONSES_STREAM_BUFFER_TTL_S at most; once its run has ended it is kept only
a short grace, long enough for the readers already tailing it to reach its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import weakref
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.utils import timezone

from common.redis_errors import with_redis_errors
from openai_api.errors import GatewayError
from openai_api.models import ResponseEvent
from openai_api.responses import store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from openai_api.responses.translator import Event

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
ENDED_GRACE_S = 60
POLL_S = 0.05  # Redis: a read is cheap
# The database log: a reader in the writer's process is woken by the append itself; one in
# another process (a resume through another gateway) looks this often, not every 50 ms.
DB_POLL_S = 0.5
FINISHED_EVERY_S = 0.5  # between looks at whether the run ended without its event


def unavailable(exc: Exception) -> GatewayError:
    return GatewayError(
        503, f"The stream log cannot be reached: {exc.__class__.__name__}.", "store_unavailable"
    )


class ReplayLog(Protocol):
    async def append(self, response_id: str, events: list[Event]) -> None: ...

    async def read(self, response_id: str, after: int) -> list[Event]:
        """The events after sequence number `after` (at once, maybe none)."""
        ...

    async def exists(self, response_id: str) -> bool: ...

    async def ended(self, response_id: str) -> None:
        """The run is over: keep the log only for the grace."""
        ...

    async def drop(self, response_id: str) -> None: ...

    async def wait(self, response_id: str) -> None:
        """Until events may have been appended (or a while has passed)."""
        ...


class RedisLog:
    def __init__(self, url: str) -> None:
        from redis import asyncio as aioredis  # noqa: PLC0415 - only where Redis is set

        self.client = aioredis.from_url(url)

    @staticmethod
    def key(response_id: str) -> str:
        return f"modelship:responses:{response_id}:events"

    async def _call(self, coroutine: Any) -> Any:
        try:
            return await coroutine
        except with_redis_errors(OSError) as exc:
            raise unavailable(exc) from exc

    async def append(self, response_id: str, events: list[Event]) -> None:
        key = self.key(response_id)
        pipe = self.client.pipeline()
        for event in events:
            # The stream id is the sequence number, so reading after N is one range query.
            pipe.xadd(key, {"e": json.dumps(event)}, id=f"{event['sequence_number'] + 1}-0")
        pipe.expire(key, int(settings.MSHIP_RESPONSES_STREAM_BUFFER_TTL_S))
        await self._call(pipe.execute())

    async def read(self, response_id: str, after: int) -> list[Event]:
        entries = await self._call(
            self.client.xrange(self.key(response_id), min=f"({after + 1}-0", max="+")
        )
        return [json.loads(fields[b"e"]) for _, fields in entries]

    async def exists(self, response_id: str) -> bool:
        return bool(await self._call(self.client.exists(self.key(response_id))))

    async def ended(self, response_id: str) -> None:
        await self._call(self.client.expire(self.key(response_id), ENDED_GRACE_S))

    async def drop(self, response_id: str) -> None:
        await self._call(self.client.delete(self.key(response_id)))

    async def wait(self, response_id: str) -> None:
        await asyncio.sleep(POLL_S)


class DatabaseLog:
    def __init__(self) -> None:
        # Held by the readers waiting on them: gone with the last reader of a response.
        self.appended: weakref.WeakValueDictionary[str, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )

    async def wait(self, response_id: str) -> None:
        signal = self.appended.get(response_id)
        if signal is None:
            signal = self.appended[response_id] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signal.wait(), DB_POLL_S)
        signal.clear()

    def _signal(self, response_id: str) -> None:
        signal = self.appended.get(response_id)
        if signal is not None:
            signal.set()

    async def append(self, response_id: str, events: list[Event]) -> None:
        expires = timezone.now() + timedelta(seconds=settings.MSHIP_RESPONSES_STREAM_BUFFER_TTL_S)
        rows = [
            ResponseEvent(
                response_id=response_id,
                sequence=event["sequence_number"],
                data=json.dumps(event),
                expires_at=expires,
            )
            for event in events
        ]
        await store.run(ResponseEvent.objects.bulk_create, rows)
        self._signal(response_id)

    async def read(self, response_id: str, after: int) -> list[Event]:
        def rows() -> list[str]:
            return list(
                ResponseEvent.objects.filter(
                    response_id=response_id, sequence__gt=after, expires_at__gt=timezone.now()
                ).values_list("data", flat=True)
            )

        return [json.loads(data) for data in await store.run(rows)]

    async def exists(self, response_id: str) -> bool:
        def any_row() -> bool:
            live = ResponseEvent.objects.filter(
                response_id=response_id, expires_at__gt=timezone.now()
            )
            return live.exists()

        return bool(await store.run(any_row))

    async def ended(self, response_id: str) -> None:
        expires = timezone.now() + timedelta(seconds=ENDED_GRACE_S)
        await store.run(
            lambda: ResponseEvent.objects.filter(response_id=response_id).update(expires_at=expires)
        )
        self._signal(response_id)

    async def drop(self, response_id: str) -> None:
        await store.run(lambda: ResponseEvent.objects.filter(response_id=response_id).delete())
        self._signal(response_id)


_logs: dict[tuple[asyncio.AbstractEventLoop, str], ReplayLog] = {}


def replay_log() -> ReplayLog:
    """This loop's log (a Redis client belongs to the loop that made it)."""
    url = settings.REDIS_URL
    key = (asyncio.get_running_loop(), url)
    if key not in _logs:
        _logs[key] = RedisLog(url) if url else DatabaseLog()
    return _logs[key]


async def tail(log: ReplayLog, response_id: str, after: int, finished: Any) -> AsyncIterator[Event]:
    """The log's events after `after` as they come, to the terminal event; `finished()`
    says whether the run ended without one (cancelled, lost), which ends the tail too."""
    looked = time.monotonic()
    while True:
        events = await log.read(response_id, after)
        for event in events:
            after = event["sequence_number"]
            yield event
            if event["type"] in TERMINAL_EVENTS:
                return
        if events:
            continue
        if time.monotonic() - looked >= FINISHED_EVERY_S:
            looked = time.monotonic()
            if await finished():
                # One last look: the final events may have landed since.
                for event in await log.read(response_id, after):
                    yield event
                return
        await log.wait(response_id)


def sweep() -> int:
    """Delete expired events of the database log."""
    deleted, _ = ResponseEvent.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted
