"""manage.py litellm_config: the entries a sync would register, as a LiteLLM `model_list`
(for a proxy without a database, which cannot take registrations: include it in its
config.yaml)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ondemand.litellm import config_yaml


class Command(BaseCommand):
    help = "Print the deployments as a LiteLLM config model_list (YAML)."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(config_yaml())
