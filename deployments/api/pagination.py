"""Pages of /api lists: `limit` (1 to 1,000; more is taken as 1,000) and `offset`, both
kept inside what a database takes (a limit of 10^22 is a 500 on PostgreSQL, whose LIMIT is
a bigint). A value that is not a whole number in range (`limit=null`, `offset=-1`) is a
400 naming the parameter, as the schema says; DRF's own pagination ignores it and answers
the first page, which a script with a bad variable takes for the whole list."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

if TYPE_CHECKING:
    from rest_framework.request import Request

MAX_OFFSET = 2**62


def whole_number(request: Request, name: str, minimum: int) -> int | None:
    """The parameter as an int, None where absent; a 400 where it is not one >= minimum."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    # Past 4,300 digits int() refuses (a 500); such a number is past every bound anyway.
    digits = raw.lstrip("0") if raw.isascii() and raw.isdigit() else ""
    value = int(digits or "0") if len(digits) <= 40 else 10**40
    if not raw.isascii() or not raw.isdigit() or value < minimum:
        raise ValidationError({name: [f"A whole number of at least {minimum} is required."]})
    return value


class Pagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_limit(self, request: Request) -> int:
        limit = whole_number(request, self.limit_query_param, 1)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        offset = whole_number(request, self.offset_query_param, 0)
        return 0 if offset is None else min(offset, MAX_OFFSET)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        minimum = {self.limit_query_param: 1, self.offset_query_param: 0}
        for parameter in parameters:
            if parameter["name"] in minimum:
                parameter["schema"] = {**parameter["schema"], "minimum": minimum[parameter["name"]]}
        return parameters
