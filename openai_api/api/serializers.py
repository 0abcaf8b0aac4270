from __future__ import annotations

from rest_framework import serializers

from deployments.api.fields import StrictNumbers
from deployments.models import name_validator
from openai_api.models import ApiKey, shown_prefix


class ApiKeySerializer(StrictNumbers, serializers.ModelSerializer):
    """A key as /api shows it: its visible prefix, never its secret or hash."""

    prefix = serializers.SerializerMethodField(help_text="How the key begins (msk-…).")
    allowed_models = serializers.ListField(
        # Names as a deployment's: a form's `allowed_models={}` is not a model called "{}".
        child=serializers.CharField(max_length=200, validators=[name_validator]),
        required=False,
        help_text="Served names or aliases this key may call; empty: all.",
    )

    rate_per_minute = serializers.SerializerMethodField(
        help_text="What the gateway lets it make per minute: its own limit, else the site's"
        " default; null: no limit."
    )
    rate_from = serializers.SerializerMethodField(help_text='"key" or "site default".')

    def get_rate_per_minute(self, obj: ApiKey) -> int | None:
        return obj.rate()[0]

    def get_rate_from(self, obj: ApiKey) -> str:
        return obj.rate()[1]

    class Meta:
        model = ApiKey
        fields: tuple[str, ...] = (
            "id",
            "name",
            "prefix",
            "allowed_models",
            "requests_per_minute",
            "priority",
            "max_concurrency",
            "rate_per_minute",
            "rate_from",
            "revoked",
            "created",
            "last_used",
        )
        read_only_fields = ("revoked", "created", "last_used")
        extra_kwargs = {"name": {"min_length": 1}}  # as the server refuses a blank one

    def get_prefix(self, key: ApiKey) -> str:
        return shown_prefix(key.prefix)


class IssuedKeySerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="The secret: shown this once.")

    class Meta(ApiKeySerializer.Meta):
        fields: tuple[str, ...] = (*ApiKeySerializer.Meta.fields, "key")
