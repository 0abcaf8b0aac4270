"""Priority classes, as API keys and deployments carry them: `high`, `normal`, `low`, or a
number between -100 and 100 (the names are 10, 0 and -10). The scheduler serves a higher
number first, ages waiting requests towards higher ones (ondemand/policy.py) and never stops
a model of a higher class to make room for a lower one."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

CLASSES = {"high": 10, "normal": 0, "low": -10}
LOWEST, HIGHEST = -100, 100
CLASS_STEP = 10  # one class apart: what aging adds per MSHIP_PRIORITY_AGING_S of waiting


def parse(value: Any) -> int:
    """A priority from a name or a number; ValueError saying what is accepted otherwise."""
    if isinstance(value, str) and value.strip().lower() in CLASSES:
        return CLASSES[value.strip().lower()]
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(_accepted())
    try:
        number = int(value)
    except ValueError:
        raise ValueError(_accepted()) from None
    if not LOWEST <= number <= HIGHEST:
        raise ValueError(_accepted())
    return number


def rank(priority: int, waited_s: float, aging_s: float) -> float:
    """A waiting request's place in a queue: its class, raised one class for every whole
    `aging_s` it has waited (0: no aging), so that a low-class request ties fresh high-class
    ones after twice `aging_s` (and goes first, having come first) and is never starved. In
    whole steps, so that within a class what breaks ties (keys' turns, arrival) decides."""
    if aging_s <= 0:
        return float(priority)
    return float(priority + CLASS_STEP * int(max(waited_s, 0.0) // aging_s))


def label(priority: int) -> str:
    """Its name where it has one, else the number."""
    names = {number: name for name, number in CLASSES.items()}
    return names.get(priority, str(priority))


def _accepted() -> str:
    return f"Use high, normal, low or a whole number from {LOWEST} to {HIGHEST}."


class PriorityField(models.IntegerField):  # type: ignore[type-arg]
    """A priority, stored as its number; a form, a models.yaml or an API may give a name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("blank", True)  # a form left empty means normal (0)
        kwargs.setdefault("validators", [MinValueValidator(LOWEST), MaxValueValidator(HIGHEST)])
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("validators", None)
        return name, path, args, kwargs

    def to_python(self, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        try:
            return parse(value)
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid") from exc

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{"form_class": PriorityFormField, **kwargs})


class PriorityFormField(forms.IntegerField):
    """The admin's field: a name is taken for its number."""

    widget = forms.TextInput

    def to_python(self, value: Any) -> int | None:
        if isinstance(value, str) and value.strip().lower() in CLASSES:
            return CLASSES[value.strip().lower()]
        found = super().to_python(value)
        return 0 if found is None else found
