"""Form fields of the admin's deployment form that read as what they hold: aliases as a list
of names, a command that is unset as an empty box (not `null`)."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.html import format_html, format_html_join


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


class StoredModelsInput(forms.TextInput):
    """The model box, offering the store's models (`store:NAME`) as it is typed in; each
    option carries the loader and use its format suggests, which deployment_form.js fills
    in where they are still empty."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__({"size": 60, "list": "ms-stored-models", **(attrs or {})})

    def render(self, name: str, value: Any, attrs: Any = None, renderer: Any = None) -> Any:
        from deployments.store.models import PullState, StoredModel  # noqa: PLC0415
        from deployments.store.refs import suggested_for  # noqa: PLC0415 - the admin's only

        rows = StoredModel.objects.filter(state=PullState.READY).order_by("name")[:500]
        options = format_html_join(
            "",
            '<option value="{}" data-loader="{}" data-usecase="{}">{}</option>',
            (
                (row.reference, *(s or "" for s in suggested_for(row)), f"{row.format} model")
                for row in rows
            ),
        )
        box = super().render(name, value, attrs, renderer)
        return format_html('{}<datalist id="ms-stored-models">{}</datalist>', box, options)
