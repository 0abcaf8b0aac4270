"""The API key `make run` prints: made once, kept in the var folder for the next run."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from openai_api.models import KEY_PREFIX, ApiKey, hash_secret

NAME = "make-run"


def key_file() -> Path:
    return Path(settings.VAR_DIR) / "api_key"


def ensure_dev_key() -> str:
    """The saved key while it still works, else a new one (saved, readable by root only)."""
    path = key_file()
    if path.exists():
        secret = path.read_text().strip()
        marker, _, rest = secret.partition("-")
        prefix, _, raw = rest.partition("-")
        key = ApiKey.objects.filter(prefix=prefix, revoked=False).first()
        if marker == KEY_PREFIX and key is not None and key.secret_hash == hash_secret(raw):
            return secret
    _, secret = ApiKey.issue(NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return secret
