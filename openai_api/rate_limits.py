"""Requests per minute per key, held across gateway processes and hosts.

Where REDIS_URL is set, the window is a sorted set in Redis that one script trims, counts
and adds to atomically, on Redis's clock, so every process behind the load balancer counts
the same arrivals. Without Redis, where this process is one of several, the site's scheduler
keeps the window (ondemand/scheduler/: one question, as one Redis script would be); a lone
process keeps its own (auth.RateLimiter). While neither Redis nor the scheduler answers, each
process keeps its own window: a limit still holds per process, and no request fails for it.

Each check says what the key's window has left (limit_headers.Left: the x-ratelimit-*-requests
headers and GET /v1/usage), from the answer it gets anyway: Redis's script counts it, the
site's scheduler says it where it is asked, and a lone process counts its own. Where the
site's scheduler lets an arrival in without asking (the key's window well below its limit,
client.admitted), the figure is a bound: about half the limit left, the oldest arrival gone
within the minute.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings

from common.redis_errors import with_redis_errors
from openai_api.auth import RateLimiter, too_many
from openai_api.limit_headers import Left

if TYPE_CHECKING:
    from openai_api.catalog import Key

log = logging.getLogger(__name__)
WARN_EVERY_S = 60.0


class SiteWindows(Protocol):
    """The site scheduler's windows, where this process is one of several (the on-demand app
    registers them at start-up; this package imports nothing of it)."""

    async def admit(self, key_id: int, limit: int) -> Left | None:
        """Raises 429 past the limit; what the window has left after this arrival, or None
        where this process keeps its own window."""
        ...


# KEYS[1]: the key's window. ARGV: limit, a unique member. Returns {admitted (1 or 0), ms
# until the oldest arrival leaves the window, the arrivals in it (this one included)}.
SLIDING_WINDOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
local count = redis.call('ZCARD', KEYS[1])
local admitted = 0
if count < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], 61000)
  admitted, count = 1, count + 1
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {admitted, tonumber(oldest[2]) + 60000 - now, count}
"""


class SharedRateLimiter:
    def __init__(self) -> None:
        self.local = RateLimiter()
        self.scripts: dict[tuple[asyncio.AbstractEventLoop, str], Any] = {}
        self.warned_at = float("-inf")
        self.site: SiteWindows | None = None

    def _script(self) -> Any:
        """This loop's script handle (a Redis client belongs to the loop that made it)."""
        url = settings.REDIS_URL
        where = (asyncio.get_running_loop(), url)
        if where not in self.scripts:
            from redis import asyncio as aioredis  # noqa: PLC0415 - only where Redis is set

            self.scripts[where] = aioredis.from_url(url).register_script(SLIDING_WINDOW)
        return self.scripts[where]

    async def check(self, key: Key) -> Left | None:
        """What the key's window has left after this request (None: it has no limit);
        GatewayError 429 with Retry-After and the x-ratelimit-*-requests headers when the key
        is over its limit (auth.too_many, whichever window refused)."""
        limit = key.requests_per_minute or settings.MSHIP_DEFAULT_RPM
        if not limit:
            return None
        if not settings.REDIS_URL:
            site = await self.site.admit(key.id, limit) if self.site is not None else None
            return site if site is not None else self.local.check(key)
        try:
            admitted, wait_ms, arrivals = await self._script()(
                # By the key's random prefix: ids repeat between databases sharing a Redis.
                keys=[f"modelship:rpm:{key.prefix}"],
                args=[limit, secrets.token_hex(8)],
            )
        except with_redis_errors(OSError) as exc:
            if time.monotonic() - self.warned_at >= WARN_EVERY_S:
                self.warned_at = time.monotonic()
                log.warning("rate limits are per process while Redis fails: %s", exc)
            return self.local.check(key)
        if not admitted:
            raise too_many(limit, max(1, math.ceil(int(wait_ms) / 1000)))
        return Left(limit, max(0, limit - int(arrivals)), max(0, int(wait_ms)) / 1000)


rate_limiter = SharedRateLimiter()
