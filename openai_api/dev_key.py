"""The API key `make run` prints: made once, kept in the var folder for the next run.

Printed only by the run that made it. A key an operator revoked stays revoked: outside
debug mode no new one is made in its place (a revocation is an operator's decision).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from common.secret_files import write_secret
from openai_api.models import KEY_PREFIX, ApiKey, hash_secret

NAME = "make-run"


def key_file() -> Path:
    return Path(settings.VAR_DIR) / "api_key"


@dataclass(frozen=True)
class DevKey:
    secret: str | None  # None: the saved key was revoked and no new one was made
    created: bool
    revoked: bool = False


def saved_key() -> tuple[str, ApiKey | None] | None:
    """The saved secret and its key row (None when no row matches it)."""
    path = key_file()
    if not path.exists():
        return None
    secret = path.read_text().strip()
    marker, _, rest = secret.partition("-")
    prefix, _, raw = rest.partition("-")
    key = ApiKey.objects.filter(prefix=prefix).first()
    if marker != KEY_PREFIX or key is None or key.secret_hash != hash_secret(raw):
        return secret, None
    return secret, key


def ensure_dev_key() -> DevKey:
    saved = saved_key()
    if saved is not None and saved[1] is not None:
        secret, key = saved
        assert key is not None
        if not key.revoked:
            return DevKey(secret, created=False)
        if not settings.DEBUG:
            return DevKey(None, created=False, revoked=True)
    _, secret = ApiKey.issue(NAME)
    write_secret(key_file(), secret)
    return DevKey(secret, created=True)
