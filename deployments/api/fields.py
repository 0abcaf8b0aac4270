"""Serializer fields that refuse what the schema refuses, and serializers that refuse fields
they do not know.

DRF's number fields take JSON's true and false as 1 and 0 (`float(False)`), so
`"num_gpus": false` was stored as 0 GPUs while the schema says a number. A ModelSerializer
that mixes in StrictNumbers maps the model's number fields to these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from django.db import models
from rest_framework import serializers
from rest_framework.settings import api_settings

from common import priority
from common.priority import PriorityField
from common.spelling import sentence, unknown

NOT_A_NUMBER = "A number is required, not true or false."


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            raise serializers.ValidationError(NOT_A_NUMBER, code="invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool):
            raise serializers.ValidationError(NOT_A_NUMBER, code="invalid")
        return super().to_internal_value(data)


class PrioritySerializerField(serializers.IntegerField):
    """A priority: high, normal, low or a whole number from -100 to 100 (shown as the
    number)."""

    def to_internal_value(self, data: Any) -> int:
        try:
            return priority.parse(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc), code="invalid") from exc


class StrictNumbers:
    """Mixed into a ModelSerializer: its model's number fields refuse booleans."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.FloatField: StrictFloatField,
        models.IntegerField: StrictIntegerField,
        models.BigIntegerField: StrictIntegerField,
        models.SmallIntegerField: StrictIntegerField,
        models.PositiveIntegerField: StrictIntegerField,
        models.PositiveSmallIntegerField: StrictIntegerField,
        models.PositiveBigIntegerField: StrictIntegerField,
        PriorityField: PrioritySerializerField,
    }


MAX_NAMED = 20  # unknown fields one answer names, with their suggestions
# A query's parameters that are DRF's, not a serializer's.
QUERY_NAMES = frozenset({"format"})
# What a browser's form adds to what it posts.
FORM_FIELDS = frozenset({"csrfmiddlewaretoken"})


class StrictFields:
    """Mixed into a Serializer: a field in the body it does not know is a 400 naming it (with
    the field it was probably meant to be), never dropped: `idel_timeout_s` answered 201 and
    left the deployment with no idle timeout. Read-only fields sent back are known, not
    refused (a client may PUT back what it read)."""

    # Fields of another spelling (models.yaml's), each with what /api calls it.
    other_spellings: ClassVar[dict[str, str]] = {}
    # Names the request may carry that are not fields (a query's `format`).
    also_known: ClassVar[frozenset[str]] = frozenset()

    def unknown_fields(self, data: Any) -> dict[str, list[str]]:
        if not isinstance(data, Mapping):
            return {}
        known = set(self.fields) | FORM_FIELDS | self.also_known  # type: ignore[attr-defined]
        found: dict[str, list[str]] = {}
        for name in data:
            if name in known:
                continue
            if len(found) >= MAX_NAMED:
                break  # named so far: a body of 250,000 made-up keys costs no more
            meant = self.other_spellings.get(name)
            found[name] = [
                f"Unknown field {name!r}: /api calls it {meant!r}."
                if meant
                else sentence(unknown(str(name), known - FORM_FIELDS - self.also_known))
            ]
        return found

    def to_internal_value(self, data: Any) -> Any:
        extra = self.unknown_fields(data)
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            if not extra:
                raise
            detail = exc.detail
            if not isinstance(detail, dict):
                detail = {api_settings.NON_FIELD_ERRORS_KEY: detail}
            raise serializers.ValidationError({**detail, **extra}) from exc
        if extra:
            raise serializers.ValidationError(extra)
        return value
