"""The `compaction` item that POST /v1/responses/compact makes (compact.py): what it holds,
how it is checked, and what an engine sees for it.

Its `encrypted_content` carries the model's summary of the conversation it replaces and
its owner (a keyed hash of the caller's identity), signed with the site's secret key
(django.core.signing: compressed and signed, not encrypted; it holds nothing the caller did
not send or get). So the item is self-contained: no server-side state to keep or expire, it
works on any connection and with `store: false`, and nobody can alter it or use it under
another identity. In a later request's input, or in the history it continues from, it stands
for that summary: the engine gets it as an assistant message at its place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import signing
from django.utils.crypto import constant_time_compare, salted_hmac

from openai_api.responses.fields import bad, new_id

if TYPE_CHECKING:
    from openai_api.errors import GatewayError

SALT = "modelship.responses.compaction"
SUMMARY_HEADING = "Summary of the conversation so far:\n"


def owner(identity: str, secret: str | bytes | None = None) -> str:
    return salted_hmac(SALT, identity, secret=secret).hexdigest()[:32]


def owners(identity: str) -> list[str]:
    """The caller's owner mark under the secret key and each it replaced: an item made
    before a key rotation stays its caller's, as its signature stays valid."""
    return [owner(identity, key) for key in [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]]


def new_item(identity: str, summary: str) -> dict[str, Any]:
    """A compaction item holding `summary`, usable by this caller only."""
    content = signing.dumps(
        {"v": 1, "owner": owner(identity), "summary": summary}, salt=SALT, compress=True
    )
    return {"id": new_id("cmp"), "type": "compaction", "encrypted_content": content}


def _payload(item: dict[str, Any]) -> dict[str, Any] | None:
    """What a compaction item holds; None where this site did not make it as it is."""
    try:
        payload = signing.loads(str(item.get("encrypted_content") or ""), salt=SALT)
    except signing.BadSignature:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("summary"), str):
        return None
    return payload


def _refused(param: str) -> GatewayError:
    return bad(
        "The compaction item was not made by this server's /v1/responses/compact for this"
        " caller, or it was altered.",
        param,
    )


def check(identity: str, items: list[dict[str, Any]], param: str | None = None) -> None:
    """Every compaction item among `items` was made here for this caller; a 400 naming the
    first that was not (`param`, else the item's place in the input)."""
    mine = owners(identity)
    for index, item in enumerate(items):
        if item.get("type") != "compaction":
            continue
        payload = _payload(item)
        marked = str(payload.get("owner")) if payload is not None else ""
        if not any(constant_time_compare(marked, each) for each in mine):
            raise _refused(param or f"input[{index}].encrypted_content")


def expanded(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items as an engine gets them: each compaction item as the assistant message of
    its summary (checked for its caller before, by `check`)."""
    if not any(item.get("type") == "compaction" for item in items):
        return items
    out = []
    for index, item in enumerate(items):
        if item.get("type") != "compaction":
            out.append(item)
            continue
        payload = _payload(item)
        if payload is None:
            raise _refused(f"input[{index}].encrypted_content")
        text = SUMMARY_HEADING + payload["summary"]
        out.append(
            {
                "id": item.get("id") or new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text}],
            }
        )
    return out
