"""Validators of the JSON shapes a model field stores, so that a form, a serializer or a
full_clean refuses a row the rest of the code could not read (a list of names that is a
number, an options mapping that is a list)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError


def list_of_names(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValidationError("must be a list of names (strings)", code="invalid_shape")


def json_object(value: Any) -> None:
    if not isinstance(value, dict):
        raise ValidationError("must be a JSON object (a mapping)", code="invalid_shape")


def command_line(value: Any) -> None:
    if value is not None and (
        not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value)
    ):
        raise ValidationError(
            "must be a command line: a non-empty list of strings", code="invalid_shape"
        )
