"""The Redis client's errors, for an `except` clause, without loading the client.

Redis serves only a site that configures it (REDIS_URL); loading its client costs every other
Modelship process a few tenths of a second at start. An except clause's tuple is evaluated
only when an exception passes, and a Redis error can only have been raised once the client
was loaded: where it is not, there is nothing of its to catch.
"""

from __future__ import annotations

import sys


def with_redis_errors(*others: type[Exception]) -> tuple[type[Exception], ...]:
    """`others` and, once its client is loaded, Redis's errors."""
    # getattr: while another thread is importing the client, its module may lack the class.
    error = getattr(sys.modules.get("redis.exceptions"), "RedisError", None)
    return (*others, error) if error is not None else others
