"""Request ids: one on every request and response, readable by the audit log."""

from __future__ import annotations

import os
import re
from contextvars import ContextVar

current_request_id: ContextVar[str] = ContextVar("current_request_id", default="")

_VALID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def make_request_id(incoming: str | None) -> str:
    """Keep a caller's id when it is sane, so logs correlate across a proxy; else make one."""
    if incoming and _VALID.match(incoming):
        return incoming
    return os.urandom(16).hex()  # as random as a uuid4, at a fraction of the cost
