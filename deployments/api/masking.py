"""What /api/deployments/ shows of a deployment's secrets.

A container's environment, secret-named config options (`hf_token`, `api_key`) and the
values of secret-named command flags (`--api-key X`) are shown only to a user who may set
them: one with `deployments.run_arbitrary_engine` (deployments/host_access.py). Everyone
else sees them masked, as every audit row shows them (common/redact.py), and learns only
that a value is set.

A masked answer sent back (a PUT of what a GET gave, a config with one option changed)
keeps the stored values where the mask stands, so a round trip never writes the mask over
a secret.
"""

from __future__ import annotations

from typing import Any

from common.redact import MASK, redact
from deployments.host_access import RUN_ARBITRARY_ENGINE

MASKED_FIELDS = ("command", "config", "docker_options")
MASKED_SUFFIX = f"={MASK}"


def may_see_secrets(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.has_perm(RUN_ARBITRARY_ENGINE))


def masked(shown: dict[str, Any]) -> dict[str, Any]:
    """A deployment's representation with the secrets of MASKED_FIELDS masked."""
    return {
        field: redact(value) if field in MASKED_FIELDS else value for field, value in shown.items()
    }


def unmasked(sent: Any, stored: Any) -> Any:
    """`sent` with every mask that stands where `stored` has a value put back to that value:
    a key's value by key, a list's item by position (an argv, an environment list)."""
    if sent == MASK and stored not in (None, MASK):
        return stored
    if isinstance(sent, dict) and isinstance(stored, dict):
        return {key: unmasked(value, stored.get(key)) for key, value in sent.items()}
    if isinstance(sent, list) and isinstance(stored, list):
        return [
            unmasked(item, stored[index]) if index < len(stored) else item
            for index, item in enumerate(sent)
        ]
    if isinstance(sent, str) and isinstance(stored, str) and sent.endswith(MASKED_SUFFIX):
        name = sent[: -len(MASK)]  # `--hf-token=` or `HF_TOKEN=`: the stored value's own name
        if stored.startswith(name):
            return stored
    return sent
