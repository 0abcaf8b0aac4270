"""Form fields of the admin's deployment form that read as what they hold: aliases as a list
of names, a command that is unset as an empty box (not `null`)."""

from __future__ import annotations

import json
from typing import Any

from django import forms


class NamesField(forms.Field):
    """Names, comma-separated ("chat, assistant"); a JSON list is taken too."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("["):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        if isinstance(value, list):
            return ", ".join(str(name) for name in value)
        return value

    def to_python(self, value: Any) -> list[str]:
        text = (value or "").strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                raise forms.ValidationError("Names, comma-separated.", code="invalid") from exc
            if not isinstance(parsed, list) or not all(isinstance(n, str) for n in parsed):
                raise forms.ValidationError("Names, comma-separated.", code="invalid")
            return [n.strip() for n in parsed if n.strip()]
        return [name.strip() for name in text.split(",") if name.strip()]

    def has_changed(self, initial: Any, data: Any) -> bool:
        return bool(self.to_python(self.prepare_value(initial)) != self.to_python(data))


class OptionalJSONField(forms.JSONField):
    """A JSON value that may be unset: shown empty rather than `null`."""

    def prepare_value(self, value: Any) -> Any:
        if value is None:
            return ""
        return super().prepare_value(value)

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and value.strip() in ("", "null"):
            return None
        return super().to_python(value)
