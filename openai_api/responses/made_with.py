"""What a response was made with: its `temperature`, `top_p` and `max_output_tokens`, as the
Open Responses specification reads them (the values the response was made with), not only
what its request set.

Each is the request's own where it set one, else what the deployment's engine makes a request
with where the request sets none (its configuration's defaults: llama-server's `--temp`,
`--top-p` and `--n-predict`, vLLM's generation config, the simulated engine's options;
`Loader.request_defaults`), else the engine's own where it is known (llama.cpp's sampling),
else the API's documented default (1 for both samplings). An answer length nobody set is the
deployment's output limit where its configuration says it (`Loader.output_token_limit`: the
most it makes), else unknown (null) until a response is cut by it: the response then says
the limit that cut it (the engine's count of the tokens it made, else the site's limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.responses.protocol import ResponsesRequest

# The Responses API's own default for a sampling setting nobody set.
API_DEFAULT = 1.0


def made_with(request: ResponsesRequest, route: Route) -> dict[str, Any]:
    """The three fields of a response object, before any output."""
    defaults = route.defaults
    return {
        "temperature": first(request.temperature, defaults.temperature, API_DEFAULT),
        "top_p": first(request.top_p, defaults.top_p, API_DEFAULT),
        "max_output_tokens": first(
            request.max_output_tokens, defaults.max_output_tokens, route.max_output_tokens
        ),
    }


def first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


def settle_cut(response: dict[str, Any], *limits: Any) -> None:
    """A response that stopped at its length says which: where its max_output_tokens was not
    known, the first of `limits` that is one (what the engine says it stopped at, its count
    of the tokens it made up to the cut, the site's limit for the deployment)."""
    if response.get("max_output_tokens") is None:
        found = (n for n in limits if isinstance(n, int) and not isinstance(n, bool) and n > 0)
        response["max_output_tokens"] = next(found, None)
