"""Whose engine caches a request may meet, so that no tenant learns what another sent.

An engine's prefix cache answers a repeated prefix faster and says so (`cached_tokens`,
llama.cpp's `timings.cache_n`): a probe that resends a guessed prompt learns whether another
tenant sent it. So a request's tenant (MSHIP_CACHE_SCOPE: its key's team, or its key) scopes
its prefix routing key (openai_api/routing/hints.py), vLLM keeps each tenant's cache apart by
a per-request `cache_salt` derived here (a caller's own salt narrows it further, never
widens it), and the cache figures of an engine that cannot keep tenants apart are taken out
of its answers (openai_api/cache_figures.py)."""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING, Any

from django.conf import settings

from openai_api.auth import current_key

if TYPE_CHECKING:
    from openai_api.catalog import Key, Route

SALTED_LOADERS = frozenset({"vllm"})  # engines that take a per-request cache salt
SALT_CHARS = 32  # vLLM takes at most 128
GENERATES = frozenset({"messages", "prompt", "input"})  # chat, completions, Responses, pooling


def tenant_of(key: Key | None) -> str:
    """The tenant whose caches the key's requests meet; "" where the site shares them."""
    scope = settings.MSHIP_CACHE_SCOPE
    if scope == "site" or key is None:
        return ""
    if scope == "team" and key.team_id:
        return f"team:{key.team_id}"
    return f"key:{key.id}"


def salt(tenant: str, asked: str = "") -> str:
    """The tenant's salt (and the caller's own within it): keyed by the site's secret, so no
    caller can name another tenant's."""
    message = f"cache\x1f{tenant}\x1f{asked}".encode()
    mac = hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256)
    return mac.hexdigest()[:SALT_CHARS]


def keeps_apart(route: Route) -> bool:
    """The route's engine keeps the request's tenant's cache apart from the others'."""
    return route.loader in SALTED_LOADERS or not tenant_of(current_key.get())


def with_cache_salt(route: Route, body: dict[str, Any]) -> dict[str, Any]:
    """A generation body for an engine that salts its cache: the tenant's salt, whatever
    the caller sent (theirs, where a string, is folded into it)."""
    if route.loader not in SALTED_LOADERS or not GENERATES.intersection(body):
        return body
    tenant = tenant_of(current_key.get())
    asked = body.get("cache_salt")
    asked = asked[:256] if isinstance(asked, str) else ""
    if tenant or asked:
        return {**body, "cache_salt": salt(tenant, asked)}
    if "cache_salt" in body:  # not a string: the site shares, and the engine takes no other
        return {k: v for k, v in body.items() if k != "cache_salt"}
    return body
