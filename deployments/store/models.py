"""A stored model: one row per name, its pull's progress while it runs, what it is once
it is there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

# A stored model's name is its folder's: no separator, no leading dot.
STORE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
STORE_NAME_RULE = "Use letters, digits and . _ - (start with a letter or digit, at most 128)."
store_name_validator = RegexValidator(STORE_NAME_PATTERN, STORE_NAME_RULE)
STORE_PREFIX = "store:"  # a deployment's model that names one


class PullState(models.TextChoices):
    QUEUED = "queued"  # waiting for a pull slot (MSHIP_MODEL_PULLS)
    PULLING = "pulling"
    READY = "ready"
    FAILED = "failed"


class StoredModel(models.Model):
    name = models.CharField(max_length=128, unique=True, validators=[store_name_validator])
    source = models.CharField(
        max_length=2000,
        help_text="hf:OWNER/REPO[@REVISION], an https URL, pypi:NAME==VERSION[#FILE], or a path.",
    )
    include = models.JSONField(
        default=list, blank=True, help_text="A repository's files to take (glob patterns)."
    )
    state = models.CharField(max_length=16, choices=PullState.choices, default=PullState.QUEUED)
    error = models.TextField(blank=True, default="")
    # Progress: bytes written to the store so far, of how many (None while unknown).
    bytes_done = models.BigIntegerField(default=0)
    bytes_total = models.BigIntegerField(null=True, blank=True)
    rate_bps = models.FloatField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0, editable=False)
    checksums = models.PositiveIntegerField(
        default=0, help_text="Files whose checksum the source published and the pull verified."
    )
    # What it is, once it is there.
    path = models.CharField(max_length=1000, blank=True, default="")
    format = models.CharField(max_length=32, blank=True, default="")
    size_bytes = models.BigIntegerField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    # Asked by a user who may reach the host: the pull may follow links out of the model
    # folders (deployments/store/local.py).
    host_access = models.BooleanField(default=False, editable=False)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("name",)
        verbose_name = "stored model"

    def __str__(self) -> str:
        return self.name

    @property
    def reference(self) -> str:
        """How a deployment names it."""
        return STORE_PREFIX + self.name

    @property
    def eta_s(self) -> float | None:
        if not (self.rate_bps and self.bytes_total) or self.state != PullState.PULLING:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / self.rate_bps)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "state": self.state}


def store_dir() -> Path:
    """Where pulls put models: `store/` in the first of MSHIP_MODEL_DIRS (a model folder,
    so a deployment naming a stored model needs no permission beyond `change`:
    deployments/host_access.py; a folder of its own, so a pull never lands on, nor a delete
    removes, a folder an administrator put beside it)."""
    return Path(settings.MSHIP_MODEL_DIRS[0]) / "store"
