"""The loader's options in the admin's deployment form as fields of their own: each under
its own name with the loader's help, one group per loader (the page shows the chosen
loader's, static/modelship/deployment_form.js), their values gathered into `config` when
one was edited, and a refusal that names an option shown next to that option. A loader
that declares no options (vLLM takes any engine argument) keeps the JSON box."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms

from deployments.admin_fields import StoredModelsInput
from deployments.loaders import LOADERS

PREFIX = "option__"


def field_name(loader: str, option: str) -> str:
    return f"{PREFIX}{loader}__{option}"


def has_options(loader: str | None) -> bool:
    return bool(loader in LOADERS and LOADERS[loader].config_options)


class OptionField(forms.CharField):
    """One option's value: JSON where it reads as JSON (4, true, ["--flag"], {"a": "b"}),
    else the text as it is (en-us); empty leaves the option out."""

    def prepare_value(self, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                return value  # plain text reads back as itself
            # Text that reads as JSON ("42", "true") is shown quoted, so it stays text.
        return json.dumps(value)

    def to_python(self, value: Any) -> Any:
        text = (value or "").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text


def option_fields() -> dict[str, forms.Field]:
    return {
        field_name(loader.name, option): OptionField(
            required=False,
            label=option,
            help_text=help_text,
            widget=forms.TextInput(attrs={"size": 50}),
        )
        for loader in LOADERS.values()
        for option, help_text in loader.config_options.items()
    }


def fieldsets() -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            f"{loader.name} options ({loader.config_key})",
            {
                "fields": [field_name(loader.name, option) for option in loader.config_options],
                "classes": ("ms-options", f"ms-options-{loader.name}"),
            },
        )
        for loader in LOADERS.values()
        if loader.config_options
    ]


def initial(loader: str, config: dict[str, Any]) -> dict[str, Any]:
    """The option fields' values from a deployment's config."""
    if not has_options(loader):
        return {}
    return {field_name(loader, option): value for option, value in config.items()}


def gathered(loader: str, data: dict[str, Any]) -> dict[str, Any]:
    """The config the chosen loader's option fields make."""
    return {
        option: data[field_name(loader, option)]
        for option in LOADERS[loader].config_options
        if data.get(field_name(loader, option)) is not None
    }


def field_of_problem(loader: str, problem: str) -> str | None:
    """The option field a refusal of the config names ("beam_size is 1 to 16")."""
    if not has_options(loader):
        return None
    named = []  # (where in the sentence, option): the first one named is the one it is about
    for option in LOADERS[loader].config_options:
        found = re.search(rf"(?<!\w){re.escape(option)}(?!\w)", problem)
        if found:
            named.append((found.start(), option))
    return field_name(loader, min(named)[1]) if named else None


class OptionsForm(forms.ModelForm):  # type: ignore[type-arg]
    """The deployment form's base: option fields filled from the config, and gathered back
    into it for a loader that has them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "model" in self.fields:  # the store's models, offered as it is typed
            self.fields["model"].widget = StoredModelsInput()
        if self.instance.pk:
            loader, config = self.instance.loader, self.instance.config or {}
            self.initial.update(initial(loader, config))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        loader = data.get("loader")
        # The option fields make the config when one of them was edited; else the JSON box
        # does (a page without the script shows both, and a script may post the box alone).
        if loader and has_options(loader) and self.options_edited(loader):
            data["config"] = gathered(loader, data)
        return data

    def options_edited(self, loader: str) -> bool:
        """One of the loader's option fields was posted with a new value (a post without
        them, from a script, leaves them out: that is no edit)."""
        names = {field_name(loader, option) for option in LOADERS[loader].config_options}
        return any(name in self.data and name in self.changed_data for name in names)


def deployment_form() -> type[OptionsForm]:
    """The form class, with a field for every option of every loader."""
    return type("DeploymentForm", (OptionsForm,), {**option_fields(), "__module__": __name__})
