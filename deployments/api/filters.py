"""Query filters of /api lists that refuse what the schema refuses.

django-filter skips a filter whose value is empty or unreadable (`?since=`, `?revoked=null`)
and answers the whole list, as though the caller had asked for nothing: a script with a
bad variable gets every row. Here such a value is a 400 with the parameter's field error.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema_field
from rest_framework.exceptions import ValidationError

from common.spelling import sentence, unknown

if TYPE_CHECKING:
    from rest_framework.request import Request

MAX_ID = 2**63 - 1  # a bigint: PostgreSQL refuses more (a 500 before this check)
TRUE_FALSE = (("true", "true"), ("false", "false"))


class StrictFilterSet(django_filters.FilterSet):
    """A parameter given with an empty value is an error, not a filter left out."""

    def is_valid(self) -> bool:
        valid = bool(super().is_valid())
        for name in self.filters:
            if name in self.data and self.data.get(name) == "":
                self.form.add_error(name, "Give a value, or leave the parameter out.")
                valid = False
        return valid


class StrictFilterBackend(DjangoFilterBackend):
    """A list's query parameter that is neither a filter, a page's nor `format` is a 400
    naming it: `?revokd=true` answered every key, which a script takes for the filtered
    list."""

    def filter_queryset(self, request: Request, queryset: Any, view: Any) -> Any:
        if getattr(view, "action", None) == "list":
            known = {"format"}
            filterset_class = self.get_filterset_class(view, queryset)
            if filterset_class is not None:
                known |= set(filterset_class.base_filters)
            paginator = getattr(view, "paginator", None)
            for name in ("limit_query_param", "offset_query_param", "page_query_param"):
                known |= {getattr(paginator, name)} if hasattr(paginator, name) else set()
            extra = {
                name: [sentence(unknown(name, known - {"format"}, "parameter"))]
                for name in request.query_params
                if name not in known
            }
            if extra:
                raise ValidationError(extra)
        return super().filter_queryset(request, queryset, view)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_ID})
class IdFilter(django_filters.Filter):
    """An object's id: an integer (else 400); an id that matches nothing finds nothing."""

    field_class = forms.IntegerField

    def __init__(self, field_name: str) -> None:
        super().__init__(field_name=field_name, min_value=1, max_value=MAX_ID)


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 time as UTC: databases take only some offsets (PostgreSQL ±15:59)."""

    def clean(self, value: Any) -> Any:
        parsed = super().clean(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(datetime.UTC)
        except (OverflowError, ValueError) as exc:
            raise forms.ValidationError("The time is out of range.", code="invalid") from exc


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


def strict_boolean(field_name: str) -> django_filters.TypedChoiceFilter:
    """A boolean filter that refuses what is not true or false (instead of ignoring it)."""
    return django_filters.TypedChoiceFilter(
        field_name=field_name, choices=TRUE_FALSE, coerce=lambda value: value == "true"
    )
