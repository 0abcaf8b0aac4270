"""The API's JSON parser: DRF's, with a depth limit.

DRF's parser lets the decoder's RecursionError through (an HTML 500 for a body nested
10,000 deep) and accepts any depth below Python's recursion limit, which every later walk
over the value (serializers, audit redaction, rendering) recurses through again. A body
nested deeper than MAX_DEPTH is a 400 with the parser's usual {detail} shape; no
deployment, key or models.yaml field comes near it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

from common.json_nesting import nesting_depth

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO

MAX_DEPTH = 64  # as the gateway's /v1 bodies (openai_api/bodies.py)


class JSONParser(parsers.JSONParser):
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        too_deep = ParseError(f"JSON parse error - the body nests deeper than {MAX_DEPTH} levels.")
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise too_deep from exc
        if nesting_depth(data, stop_above=MAX_DEPTH) > MAX_DEPTH:
            raise too_deep
        return data
