"""The query of /api/usage/: a time range (ISO 8601, or relative: `24h` is the last 24 hours),
a key, a team and a model to narrow it to, and what to group by. Anything it cannot read is a
400 naming the parameter."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from rest_framework import serializers

from deployments.api.fields import QUERY_NAMES, StrictFields
from deployments.api.filters import MAX_ID
from openai_api.models import KEY_PREFIX, ApiKey
from openai_api.usage.models import Team
from openai_api.usage.report import check_by

RELATIVE = re.compile(r"(\d{1,7})([smhdw])")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
DEFAULT_SPAN = timedelta(hours=24)
WHEN_HELP = "ISO 8601 (UTC where it names no offset), or a time ago: 30m, 24h, 7d, 2w."


def moment(text: str, now: datetime) -> datetime:
    """A time the caller gave: ISO 8601 (a date alone is its UTC midnight; no offset is UTC),
    or how long ago (`90s`, `30m`, `24h`, `7d`, `2w`)."""
    relative = RELATIVE.fullmatch(text)
    try:
        if relative:
            amount, unit = relative.groups()
            return now - timedelta(**{UNITS[unit]: int(amount)})
        parsed = parsed_time(text)
        if parsed is not None:
            aware = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
            return aware.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise serializers.ValidationError("The time is out of range.") from exc
    raise serializers.ValidationError(WHEN_HELP)


def parsed_time(text: str) -> datetime | None:
    """An ISO 8601 time or date (its midnight); None where it is neither, or no such day."""
    try:
        parsed = parse_datetime(text)
        if parsed is None and (day := parse_date(text)) is not None:
            parsed = datetime(day.year, day.month, day.day)
    except ValueError:
        return None
    return parsed


def key_id_of(text: str) -> int:
    """A key by its id (one deleted too: its usage stays), its `msk-` prefix or its name."""
    if text.isascii() and text.isdigit():
        if int(text) > MAX_ID:
            raise serializers.ValidationError("No such key.")
        return int(text)
    keys = ApiKey.objects.all()
    if text.startswith(f"{KEY_PREFIX}-"):
        keys = keys.filter(prefix=text.removeprefix(f"{KEY_PREFIX}-").split("-")[0])
    else:
        keys = keys.filter(name=text)
    found = list(keys.values_list("pk", flat=True)[:2])
    if not found:
        raise serializers.ValidationError(f"No key {text!r}: give its id, msk- prefix or name.")
    if len(found) > 1:
        raise serializers.ValidationError(f"Several keys are named {text!r}: give id or prefix.")
    return found[0]


def team_id_of(text: str) -> int:
    """A team by its id (one deleted too) or its name."""
    if text.isascii() and text.isdigit():
        if int(text) > MAX_ID:
            raise serializers.ValidationError("No such team.")
        return int(text)
    found = Team.objects.filter(name=text).values_list("pk", flat=True).first()
    if found is None:
        raise serializers.ValidationError(f"No team {text!r}: give its id or name.")
    return found


PARAMS = ("since", "until", "key", "team", "model", "by")


class UsageParams(StrictFields, serializers.Serializer):
    also_known = QUERY_NAMES
    since = serializers.CharField(required=False, max_length=64, help_text=WHEN_HELP)
    until = serializers.CharField(required=False, max_length=64, help_text=WHEN_HELP)
    key = serializers.CharField(required=False, max_length=200)
    team = serializers.CharField(required=False, max_length=200)
    model = serializers.CharField(required=False, max_length=200)
    by = serializers.CharField(required=False, max_length=64, default="key")

    def validate_key(self, text: str) -> int:
        return key_id_of(text)

    def validate_team(self, text: str) -> int:
        return team_id_of(text)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        now = timezone.now()
        # A form leaves out an empty optional value: here it is a mistake, not no filter.
        errors: dict[str, Any] = {
            name: ["Give a value, or leave the parameter out."]
            for name in PARAMS
            if name in self.initial_data and self.initial_data.get(name) == ""
        }
        times: dict[str, datetime] = {}
        for name in ("since", "until"):
            if name in data:
                try:
                    times[name] = moment(data[name], now)
                except serializers.ValidationError as exc:
                    errors[name] = exc.detail
        until = times.get("until", now)
        since = times.get("since", until - DEFAULT_SPAN)
        if not errors and since >= until:
            errors["until"] = ["Must be later than since."]
        by = tuple(part.strip() for part in data["by"].split(","))
        if not errors:
            try:
                check_by(by, since, until)
            except ValueError as exc:
                errors["by"] = [str(exc)]
        if errors:
            raise serializers.ValidationError(errors)
        return {**data, "since": since, "until": until, "by": by}
