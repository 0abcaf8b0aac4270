"""GET /api/usage/: tokens, requests and GPU-seconds per key, team or model and per minute,
hour or day, read from the usage table (openai_api/usage/report.py); as JSON, or as CSV
(`?format=csv` or `Accept: text/csv`) for a spreadsheet. Whoever may view API keys may read
it."""

from __future__ import annotations

import csv
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.http import Http404, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from openai_api.api.usage_params import UsageParams
from openai_api.usage import gpu_share
from openai_api.usage.report import row_columns, usage_rows, usage_totals

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from rest_framework.request import Request

# A spreadsheet runs a cell that begins with one of these as a formula.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class UsagePermission(BasePermission):
    """Staff who may view API keys: usage names them."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not user or not user.is_authenticated or not user.is_staff:
            return False
        return bool(user.has_perm("openai_api.view_apikey"))


class CsvRenderer(BaseRenderer):
    """Selects CSV (`?format=csv`, `Accept: text/csv`); the rows are streamed by the view."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        rows = data.get("rows", []) if isinstance(data, dict) else []
        columns = tuple(rows[0]) if rows else ()
        return "".join(csv_lines(columns, rows)).encode()


class Line:
    """What csv.writer writes to: each row comes back as its text."""

    def write(self, text: str) -> str:
        return text


def cell(value: Any) -> Any:
    """A value as a CSV cell: times in ISO 8601, none as empty, and text a spreadsheet would
    read as a formula behind an apostrophe."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def csv_lines(columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    writer = csv.writer(Line())
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow([cell(row.get(name)) for name in columns])


class UsageAnswer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    by = serializers.ListField(child=serializers.CharField())
    rows = serializers.ListField(
        child=serializers.DictField(),
        help_text="Per group: its time (the bucket's start), key_id, key and key_prefix, team_id"
        " and team, or model; then requests, errors, tokens_in, tokens_out, tokens,"
        " tokens_cached, tokens_estimated, gpu_seconds, duration_s, ttft_mean_s, images,"
        " audio_s, characters; by model (not narrowed to a key or a team) load_gpu_seconds"
        " (its starts and wakes) and idle_gpu_seconds (held less loads and requests).",
    )
    totals = serializers.DictField(help_text="The same counters over every row.")
    gpu_seconds_basis = serializers.CharField(
        help_text="What a GPU-second is a second of: `gpus` (a whole GPU), or `memory budget`"
        " (on a host without GPUs: the whole memory budget)."
    )


WHEN = "ISO 8601, or a time ago: 30m, 24h, 7d, 2w"
PARAMETERS = [
    OpenApiParameter("since", str, description=f"{WHEN} (default: 24h before until)"),
    OpenApiParameter("until", str, description=f"{WHEN} (default: now)"),
    OpenApiParameter("key", str, description="a key's id, msk- prefix or name"),
    OpenApiParameter("team", str, description="a team's id or name"),
    OpenApiParameter("model", str, description="a deployment's name"),
    OpenApiParameter(
        "by",
        str,
        description="key, team or model and/or minute, hour or day, comma-separated (model,hour);"
        " default key",
    ),
    OpenApiParameter("format", str, enum=["json", "csv"], description="csv: a spreadsheet"),
]


class UsageView(APIView):
    permission_classes = [UsagePermission]
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, CsvRenderer]

    @extend_schema(
        parameters=PARAMETERS,
        responses={(200, "application/json"): UsageAnswer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> Any:
        params = UsageParams(data=request.query_params)
        params.is_valid(raise_exception=True)
        query = params.validated_data
        since, until, by = query["since"], query["until"], query["by"]
        narrowed = {
            "key_id": query.get("key"),
            "team_id": query.get("team"),
            "deployment": query.get("model"),
        }
        rows = usage_rows(since, until, by=by, **narrowed)
        if isinstance(request.accepted_renderer, CsvRenderer):
            idle = narrowed["key_id"] is None and narrowed["team_id"] is None
            columns = row_columns(by, idle=idle)
            response = StreamingHttpResponse(
                csv_lines(columns, rows), content_type="text/csv; charset=utf-8"
            )
            response["Content-Disposition"] = "attachment; filename=usage.csv"
            return response
        totals = usage_totals(since, until, **narrowed)
        return Response(
            {
                "since": since,
                "until": until,
                "by": list(by),
                "rows": rows,
                "totals": totals,
                "gpu_seconds_basis": gpu_share.basis(),
            }
        )

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        try:
            return super().perform_content_negotiation(request, force)
        except Http404 as exc:  # DRF's answer to a `format` it has no renderer for
            raise ValidationError({"format": ["json or csv."]}) from exc

    def handle_exception(self, exc: Exception) -> Response:
        """Errors in JSON, whatever format was asked for: field errors a script can read."""
        response = super().handle_exception(exc)
        request = self.request
        if isinstance(getattr(request, "accepted_renderer", CsvRenderer()), CsvRenderer):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return response
