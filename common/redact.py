"""Secrets masked out of what is recorded: audit rows, logs, an engine's command line.

A value is masked when its key is named like a secret (token, password, api_key, …), when it
is an environment variable's value (a container's or an engine's `environment`), or when it
follows a command-line flag named like a secret (`--api-key X`, `--hf-token=X`).
"""

from __future__ import annotations

import re
from typing import Any

MASK = "********"
# Whole words of a name (hf_token, --api-key, DB_PASSWORD), so max_tokens stays readable.
SECRET_NAME = re.compile(
    r"(^|[_.-])(api[_-]?key|private[_-]?key|access[_-]?key|secret[_-]?key|key[_-]?file|token"
    r"|secret|password|passwd|auth|authorization|credentials?|cookie)($|[_.-])",
    re.IGNORECASE,
)
ENVIRONMENT_KEYS = frozenset({"environment", "env"})


def redact(value: Any, key: str = "") -> Any:
    """A copy of `value` with its secrets masked."""
    if key and SECRET_NAME.search(key.lstrip("-")) and value not in (None, "", [], {}):
        return MASK
    if isinstance(value, dict):
        if key in ENVIRONMENT_KEYS:
            return {str(k): MASK for k in value}
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        if key in ENVIRONMENT_KEYS:
            return [f"{str(v).partition('=')[0]}={MASK}" for v in value]
        if all(isinstance(v, str) for v in value):
            return redact_argv(value)
        return [redact(v) for v in value]
    return value


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the values of secret-named flags masked."""
    out: list[str] = []
    mask_next = False
    for part in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        flag, equals, _ = part.partition("=")
        if part.startswith("-") and SECRET_NAME.search(flag.lstrip("-")):
            if equals:
                out.append(f"{flag}={MASK}")
            else:
                out.append(part)
                mask_next = True
            continue
        out.append(part)
    return out


# A URL's user information (`redis://:pw@host`, `http://user:pass@ray:8265`, up to its last
# `@`: a password may hold one) and its secret-named query parameters (`?token=…`,
# `?access_token=…`, a signed URL's `?sig=…` or `X-Amz-Signature=…`), wherever a URL
# appears in a text: an address a setting names, a pull's source, an error quoting it.
URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s?#]+@")
URL_PARAM = re.compile(r"(?P<lead>[?&](?P<name>[^=&#\s]+)=)[^&#\s]+")
# Whole names, or a name's last word (`X-Amz-Signature`, `X-Goog-Signature`, `hf_key`).
URL_SECRET_PARAMS = frozenset(
    {"key", "sig", "signature", "code", "jwt", "sas", "pwd", "pass", "session", "sessionid"}
)
NAME_WORDS = re.compile(r"[_.-]")


def _masked_param(match: re.Match[str]) -> str:
    name = match["name"]
    last = NAME_WORDS.split(name.lower())[-1]
    if SECRET_NAME.search(name) or name.lower() in URL_SECRET_PARAMS or last in URL_SECRET_PARAMS:
        return f"{match['lead']}{MASK}"
    return match[0]


def redact_urls(value: Any) -> Any:
    """A copy of `value` (a text, or lists and dicts of them) with every URL's credentials
    masked; the rest of each URL stays, so an operator still sees where it points."""
    if isinstance(value, str):
        value = URL_USERINFO.sub(rf"\g<scheme>{MASK}@", value)
        return URL_PARAM.sub(_masked_param, value) if "://" in value else value
    if isinstance(value, dict):
        return {k: redact_urls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_urls(v) for v in value]
    return value
