"""How many tokens a request may ask a deployment to generate.

Each route carries its deployment's limit (its context length where its engine's
configuration says it, else its `max_output_tokens` option: `Loader.output_token_limit`),
and MSHIP_MAX_OUTPUT_TOKENS stands in where neither is known. A request asking for more is
refused with OpenAI's own 400 (`max_tokens is too large`, naming the field) before any
engine sees it, rather than clamped: a caller learns its request cannot be served as asked,
and an engine is never asked to make two billion tokens. Checked from the route table in
memory: no query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings

from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from openai_api.catalog import Route

# Chat completions take the first two, completions and Anthropic's messages max_tokens, the
# Responses API max_output_tokens.
FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def limit_of(route: Route) -> int:
    return route.max_output_tokens or int(settings.MSHIP_MAX_OUTPUT_TOKENS)


def check_output_tokens(route: Route, data: dict[str, Any] | None) -> None:
    """400 invalid_value naming the field when a JSON body asks `route` for more tokens
    than it may make. A value of the wrong type is left to the endpoint's own checks."""
    if not data:
        return
    limit = limit_of(route)
    for field in FIELDS:
        value = data.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
            raise GatewayError(
                400,
                f"{field} is too large: {value}. This model supports at most {limit}"
                f" completion tokens, whereas you provided {value}.",
                "invalid_value",
                param=field,
            )
