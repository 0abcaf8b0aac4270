from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from deployments.api.fields import StrictFields, StrictNumbers
from deployments.api.filters import MAX_ID
from deployments.models import name_validator
from openai_api.models import ApiKey, shown_prefix
from openai_api.usage.models import BUDGETS, Team
from openai_api.usage.report import budget_status

BUDGET_FIELDS = tuple(field for field, _, _ in BUDGETS)


class BudgetStatusSerializer(serializers.Serializer):
    """One budget a key or a team sets, and how much of it is used."""

    budget = serializers.CharField(help_text="The budget's field (tokens_per_day…).")
    counts = serializers.CharField(help_text="tokens, gpu_seconds or requests")
    period = serializers.CharField(help_text="day or month (UTC)")
    limit = serializers.IntegerField()
    used = serializers.FloatField(help_text="Used this UTC day or calendar month.")
    percent = serializers.FloatField()
    resets_at = serializers.DateTimeField(help_text="The next UTC midnight, or next month's 1st.")


class BudgetedSerializer(StrictFields, StrictNumbers, serializers.ModelSerializer):
    budget_status = serializers.SerializerMethodField(
        help_text="Each budget it sets, with what was used of it this UTC day or month."
    )

    @extend_schema_field(BudgetStatusSerializer(many=True))
    def get_budget_status(self, obj: ApiKey | Team) -> list[dict[str, Any]]:
        return budget_status(obj)


@extend_schema_field(
    {
        "anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_ID}, {"type": "string"}],
        "nullable": True,
        "description": "Its team: an id or a name (shown by name); null: none.",
    }
)
class TeamField(serializers.RelatedField):
    """A team by its id or its name; shown by its name."""

    default_error_messages = {
        "missing": "No team {value!r}: give a team's id or name.",
        "invalid": "A team's id or name is required.",
    }

    def to_internal_value(self, data: Any) -> Team:
        if isinstance(data, bool) or not isinstance(data, int | str) or data == "":
            self.fail("invalid")
        text = str(data)
        if text.isascii() and text.isdigit():
            # 20 digits at most: int() refuses past 4,300 (a 500), MAX_ID has 19.
            small = len(text) <= 20 and int(text) <= MAX_ID
            found = Team.objects.filter(pk=int(text)).first() if small else None
        else:
            found = Team.objects.filter(name=text).first()
        if found is None:
            self.fail("missing", value=text)
        return found

    def to_representation(self, value: Any) -> str:
        return str(value.name)


class ApiKeySerializer(BudgetedSerializer):
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
    team = TeamField(queryset=Team.objects.all(), required=False, allow_null=True)

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
            "team",
            *BUDGET_FIELDS,
            "budget_status",
            "revoked",
            "created",
            "last_used",
        )
        read_only_fields = ("revoked", "created", "last_used")
        extra_kwargs = {"name": {"min_length": 1}}  # as the server refuses a blank one

    def get_prefix(self, key: ApiKey) -> str:
        return shown_prefix(key.prefix)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """A key's team and budgets are the teams' keeper's to set (change_team): one who may
        only change keys cannot lift a key's budget or take it out of its team's."""
        request = self.context.get("request")
        guarded = [name for name in ("team", *BUDGET_FIELDS) if name in attrs]
        if self.instance is not None:
            guarded = [n for n in guarded if attrs[n] != getattr(self.instance, n)]
        else:
            guarded = [n for n in guarded if attrs[n] is not None]
        user = getattr(request, "user", None)
        # Fail closed: a serializer built without its request judges as one without the right.
        if guarded and (user is None or not user.has_perm("openai_api.change_team")):
            raise serializers.ValidationError(
                {n: "Setting this needs the permission to change teams." for n in guarded}
            )
        return attrs


class IssuedKeySerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="The secret: shown this once.")

    class Meta(ApiKeySerializer.Meta):
        fields: tuple[str, ...] = (*ApiKeySerializer.Meta.fields, "key")


class TeamSerializer(BudgetedSerializer):
    """A team (or a project): its keys' usage counts towards its budgets."""

    keys = serializers.SerializerMethodField(help_text="How many keys it has.")

    class Meta:
        model = Team
        fields = ("id", "name", "description", *BUDGET_FIELDS, "keys", "budget_status", "created")
        read_only_fields = ("created",)
        extra_kwargs = {"name": {"min_length": 1}}

    def validate_name(self, name: str) -> str:
        if name.isascii() and name.isdigit():
            raise serializers.ValidationError("Not only digits: a key's team reads those as an id.")
        return name

    def get_keys(self, team: Team) -> int:
        counted = getattr(team, "key_count", None)
        return int(counted) if counted is not None else team.keys.count()
