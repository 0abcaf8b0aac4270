"""Serializer fields that refuse what the schema refuses.

DRF's number fields take JSON's true and false as 1 and 0 (`float(False)`), so
`"num_gpus": false` was stored as 0 GPUs while the schema says a number. A ModelSerializer
that mixes in StrictNumbers maps the model's number fields to these.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from rest_framework import serializers

from common import priority
from common.priority import PriorityField

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
