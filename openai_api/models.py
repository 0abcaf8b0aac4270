"""API keys of the public /v1 gateway."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from common.json_shapes import list_of_names
from common.priority import PriorityField
from common.versioned import Versioned, VersionedQuerySet
from openai_api.usage.models import Budgeted, Team
from openai_api.usage.models import UsageMinute as UsageMinute  # the app's models

KEY_PREFIX = "msk"


def shown_prefix(prefix: str) -> str:
    """How a key begins (msk-1a2b3c4d): what logs, metrics and lists show of it."""
    return f"{KEY_PREFIX}-{prefix}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKey(Budgeted, Versioned):
    """A client's key: stored hashed, shown once; its visible prefix finds it."""

    UNVERSIONED = frozenset({"last_used"})
    objects = VersionedQuerySet["ApiKey"].as_manager()

    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    revoked = models.BooleanField(default=False)
    allowed_models = models.JSONField(
        default=list,
        blank=True,
        validators=[list_of_names],
        help_text="Served names or aliases this key may call; empty: all.",
    )
    requests_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Empty: the site's default (MSHIP_DEFAULT_RPM, 6,000 unless set; 0 there: no"
        " limit).",
    )
    max_concurrency = models.PositiveIntegerField(
        "most requests at once",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="On the whole site, over every model: more wait or get 429, as"
        " MSHIP_CONCURRENCY_OVERFLOW says; empty: no limit.",
    )
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="keys",
        help_text="Its usage counts towards the team's, and the team's budgets bind it too.",
    )
    priority = PriorityField(
        help_text="high, normal, low or a number from -100 to 100: added to the model's own"
        " class, it orders this key's requests in the on-demand queue, and a request never stops"
        " a model of a class above its own (a waiting one rises a class every"
        " MSHIP_PRIORITY_AGING_S).",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({shown_prefix(self.prefix)}-…)"

    def rate(self) -> tuple[int | None, str]:
        """The requests per minute the gateway lets it make (None: no limit), and whose
        figure that is: the key's own or the site's default."""
        if self.requests_per_minute:
            return self.requests_per_minute, "key"
        return settings.MSHIP_DEFAULT_RPM or None, "site default"

    @classmethod
    def issue(cls, name: str, **fields: object) -> tuple[ApiKey, str]:
        """Make a key; returns it with the full secret, which is never stored."""
        prefix = secrets.token_hex(4)
        secret = secrets.token_urlsafe(32)
        key = cls.objects.create(
            name=name, prefix=prefix, secret_hash=hash_secret(secret), **fields
        )
        return key, f"{KEY_PREFIX}-{prefix}-{secret}"


class StoredResponse(models.Model):
    """One Responses API answer, self-contained: continuing from it is a single read.

    `conversation` holds every input item up to and including this turn's (earlier turns'
    inputs and outputs), so a branch from any stored id needs nothing else. `identity` is
    the caller's (its API key, or the trusted identity header): another caller's lookup of
    the same id simply misses."""

    id = models.CharField(max_length=64, primary_key=True)
    identity = models.CharField(max_length=200, db_index=True)
    model = models.CharField(max_length=200)
    status = models.CharField(max_length=16)
    response = models.JSONField()
    conversation = models.JSONField(default=list)
    # Bytes of the response and its conversation as JSON: the identity's storage quota.
    size = models.PositiveBigIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.id


class ResponseHeartbeat(models.Model):
    """A background run's sign of life, kept apart from its snapshot: a beat can never race
    a terminal write and bring a finished response back to life."""

    response_id = models.CharField(max_length=64, primary_key=True)
    beat_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.response_id} alive at {self.beat_at}"


class ResponseEvent(models.Model):
    """The replay log of a streamed background run, where no Redis is configured."""

    response_id = models.CharField(max_length=64, db_index=True)
    sequence = models.PositiveIntegerField()
    data = models.TextField()
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["response_id", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["response_id", "sequence"], name="one_event_per_seq")
        ]

    def __str__(self) -> str:
        return f"{self.response_id} #{self.sequence}"


class Conversation(models.Model):
    """A conversation of the Responses API: items that responses made in it read as their
    context and extend, scoped by the caller's identity like stored responses. It lives
    until deleted; its items count towards the caller's storage quota."""

    id = models.CharField(max_length=64, primary_key=True)
    identity = models.CharField(max_length=200, db_index=True)
    metadata = models.JSONField(default=dict)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.id


class ConversationItem(models.Model):
    """One item of a conversation, in the order it was added."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="items")
    item_id = models.CharField(max_length=64)
    item = models.JSONField()
    size = models.PositiveIntegerField(default=0)  # bytes as JSON: the storage quota

    class Meta:
        ordering = ["conversation", "id"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "item_id"], name="one_item_per_id")
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id} {self.item_id}"
