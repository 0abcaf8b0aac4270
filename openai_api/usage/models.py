"""Teams, the budgets keys and teams carry, and the per-minute usage rollup."""

from __future__ import annotations

import secrets

from django.db import models

from common.versioned import Versioned, VersionedQuerySet

# (field, what it counts, the period it resets after): the budgets a key or a team may set.
BUDGETS = (
    ("tokens_per_day", "tokens", "day"),
    ("tokens_per_month", "tokens", "month"),
    ("gpu_seconds_per_day", "gpu_seconds", "day"),
    ("gpu_seconds_per_month", "gpu_seconds", "month"),
    ("requests_per_day", "requests", "day"),
)


def budget_field(what: str) -> models.PositiveBigIntegerField[int | None, int | None]:
    return models.PositiveBigIntegerField(
        null=True, blank=True, help_text=f"Empty: no limit. {what} (UTC)."
    )


class Budgeted(models.Model):
    """Limits on what a key or a team may use per UTC day and month: past one, its requests
    get 429 budget_exceeded until the period resets (a stream under way is let finish)."""

    tokens_per_day = budget_field("Input plus output tokens per day")
    tokens_per_month = budget_field("Input plus output tokens per calendar month")
    gpu_seconds_per_day = budget_field("GPU-seconds per day")
    gpu_seconds_per_month = budget_field("GPU-seconds per calendar month")
    requests_per_day = budget_field("Requests per day")

    class Meta:
        abstract = True

    def budgets(self) -> tuple[tuple[str, int], ...]:
        """The budgets it sets: (field, limit)."""
        return tuple(
            (name, limit) for name, _, _ in BUDGETS if (limit := getattr(self, name)) is not None
        )


def new_ref() -> str:
    return secrets.token_hex(6)


class Team(Budgeted, Versioned):
    """A group of keys (a team or a project): its usage is theirs summed, and its budgets
    hold over all of them together."""

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    # Random: names Redis counters, which several databases (sites, test runs) may share.
    ref = models.CharField(max_length=16, unique=True, default=new_ref, editable=False)
    created = models.DateTimeField(auto_now_add=True)

    objects = VersionedQuerySet["Team"].as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class UsageMinute(models.Model):
    """What one key (0: none) of one team (0: none) used of one deployment in one minute.

    Plain ids, no foreign keys: usage outlives a deleted key or team. Rows are added to, not
    replaced: every gateway process flushes its own minute's figures into the same row
    (openai_api/usage/ledger.py). `key_id` -1 is a deployment's idle account (loaded, nothing
    in flight): computed when read (openai_api/usage/report.py), never stored."""

    minute = models.DateTimeField(db_index=True)
    key_id = models.BigIntegerField(default=0)
    team_id = models.BigIntegerField(default=0, db_index=True)
    deployment = models.CharField(max_length=200, default="")
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    tokens_cached = models.PositiveBigIntegerField(default=0)
    # Of tokens_in + tokens_out, those the gateway estimated (the engine reported none).
    tokens_estimated = models.PositiveBigIntegerField(default=0)
    gpu_seconds = models.FloatField(default=0.0)
    duration_s = models.FloatField(default=0.0)
    ttft_s = models.FloatField(default=0.0)  # summed over ttft_count requests
    ttft_count = models.PositiveBigIntegerField(default=0)
    images = models.PositiveBigIntegerField(default=0)
    audio_s = models.FloatField(default=0.0)
    characters = models.PositiveBigIntegerField(default=0)
    # Of the deployment's load account (its starts and wakes), the part this key's requests
    # waited for (ondemand/controller.py): an attribution of that account, not added to it.
    load_gpu_seconds = models.FloatField(default=0.0)

    class Meta:
        ordering = ["-minute"]
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "key_id", "team_id", "deployment"], name="one_usage_row"
            )
        ]
        indexes = [models.Index(fields=["key_id", "minute"], name="usage_by_key")]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} key {self.key_id} {self.deployment}"


# The counted fields, in the order the ledger keeps them.
COUNTED = (
    "requests",
    "errors",
    "tokens_in",
    "tokens_out",
    "tokens_cached",
    "tokens_estimated",
    "gpu_seconds",
    "duration_s",
    "ttft_s",
    "ttft_count",
    "images",
    "audio_s",
    "characters",
    "load_gpu_seconds",
)
# Each counted field's place in a ledger row, by the same order.
(
    REQUESTS,
    ERRORS,
    TOKENS_IN,
    TOKENS_OUT,
    TOKENS_CACHED,
    TOKENS_ESTIMATED,
    GPU,
    DURATION,
    TTFT,
    TTFT_COUNT,
    IMAGES,
    AUDIO,
    CHARACTERS,
    LOAD,
) = range(len(COUNTED))
