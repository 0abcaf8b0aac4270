"""POST /v1/responses/compact: a long conversation made short enough to go on with.

The body names a model and what to compact: `input` items, the history of a stored
`previous_response_id` (the caller's own, as a continuation resolves it), or both;
`instructions` are the conversation's system prompt. The model is asked once, in a slot like
any create, to summarise the whole conversation, and the answer (a `response.compaction`)
is the compacted window: every user message as it was sent, then one `compaction` item
holding the summary (compaction.py), with the usage of that call. The window is passed as
the input of a new response (over HTTP or a WebSocket, without `previous_response_id`), where
the summary stands in for everything else the conversation held.

A summary rather than the items kept aside: compaction exists to shrink what the model is
sent, and a client compacts because its context is nearly full. Nothing is stored; the
compaction item carries its summary itself.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from openai_api.errors import GatewayError
from openai_api.forwarder import cancel_on_hangup
from openai_api.responses import compaction
from openai_api.responses.fields import bad, new_id
from openai_api.responses.protocol import text_of
from openai_api.responses.respond import respond
from openai_api.responses.turn import prepare

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.exchange import Exchange
    from openai_api.responses.translator import Event

# What the model is asked, after the conversation, as a last user message.
PROMPT = (
    "Compact the conversation above into a summary that will replace it: the conversation"
    " then goes on from the user's messages and your summary alone. Keep every fact,"
    " decision, name, number, file, tool call and tool result, open question and pending"
    " task that a later turn may need, and what you were doing last; leave out greetings and"
    " repetition. Write only the summary."
)
# The body's fields a compaction reads (the Open Responses CompactResponseMethodPublicBody);
# prompt_cache_key is accepted and has nothing to key here.
FIELDS = ("model", "previous_response_id", "instructions", "prompt_cache_key")
NO_USAGE = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}


async def create(exchange: Exchange, route: Route, identity: str, data: dict[str, Any]) -> None:
    async with cancel_on_hangup(exchange):
        body = await compacted(route, identity, data, exchange.request_id)
    await exchange.json(200, json.dumps(body).encode())


async def compacted(
    route: Route, identity: str, data: dict[str, Any], request_id: str
) -> dict[str, Any]:
    """The `response.compaction` object for a compact request's body."""
    given = data.get("input")
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    elif given is not None and not isinstance(given, list):
        raise bad("'input' must be a string or a list of items.", "input")
    if not given and data.get("previous_response_id") is None:
        raise bad("Nothing to compact: give 'input', 'previous_response_id' or both.", "input")
    asked = {name: data[name] for name in FIELDS if data.get(name) is not None}
    asked.update(input=[*(given or []), {"role": "user", "content": PROMPT}], store=False)
    # As a create is prepared: the caller's previous response, its images, its compactions.
    turn = await prepare(route, identity, asked)
    translator = turn.translator
    translator.start()
    if not await respond(route, turn.request, turn.history, translator, discard, request_id):
        error = translator.response.get("error") or {}
        raise GatewayError(
            502,
            f"The model could not compact the conversation: {error.get('message')}",
            str(error.get("code") or "upstream_error"),
        )
    translator.finish()
    answer = translator.response
    summary = "\n".join(
        text_of(item.get("content") or [])
        for item in answer["output"]
        if item.get("type") == "message" and item.get("role") == "assistant"
    )
    if not summary.strip():
        # An item of nothing would drop the conversation it stands for without a word.
        raise GatewayError(
            502,
            "The model could not compact the conversation: it wrote no summary.",
            "empty_summary",
        )
    context = [*turn.history, *turn.request.input_items[:-1]]  # without the PROMPT
    kept = [i for i in context if i.get("type") == "message" and i.get("role") == "user"]
    return {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*kept, compaction.new_item(identity, summary)],
        "usage": answer.get("usage") or NO_USAGE,  # last: the access log reads it there
    }


async def discard(events: list[Event]) -> None:
    """A compaction is one answer, not a stream: its events go nowhere."""
