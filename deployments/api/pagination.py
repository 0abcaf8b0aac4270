"""Pages of /api lists: `limit` (at most 1,000) and `offset`, both kept inside what a
database takes (a limit of 10^22 is a 500 on PostgreSQL, whose LIMIT is a bigint)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework.pagination import LimitOffsetPagination

if TYPE_CHECKING:
    from rest_framework.request import Request

MAX_OFFSET = 2**62


class Pagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_offset(self, request: Request) -> int:
        return min(super().get_offset(request), MAX_OFFSET)
