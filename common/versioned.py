"""Rows whose table a reader keeps in memory, and the cheap question "has it changed?".

Each row has a `version` that every write raises: `save()`, and a queryset's `update()`
(which Django runs without `save()`, signals or `auto_now`). A table's stamp is its row
count, the sum of its versions and its highest primary key, one aggregate query: an update
raises the sum, a delete lowers the count, a new row raises the highest key (keys are never
reused: Django's SQLite tables use AUTOINCREMENT, PostgreSQL a sequence). The gateway asks
for the stamp twice a second and reads the table again only when it moved
(openai_api/catalog.py).

A write that touches only fields no reader keeps (`UNVERSIONED`, such as a lease's expiry
or a key's last use) leaves the version alone, so it does not make every reader reload.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from django.db import models
from django.db.models import Count, F, Max, Sum

Stamp = tuple[int, int, int]
M = TypeVar("M", bound=models.Model)


class VersionedQuerySet(models.QuerySet[M]):
    def update(self, **kwargs: Any) -> int:
        unversioned: frozenset[str] = getattr(self.model, "UNVERSIONED", frozenset())
        if "version" not in kwargs and not set(kwargs) <= unversioned:
            kwargs["version"] = F("version") + 1
        return super().update(**kwargs)


class Versioned(models.Model):
    version = models.PositiveBigIntegerField(default=1, editable=False)

    UNVERSIONED: ClassVar[frozenset[str]] = frozenset()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        fields = kwargs.get("update_fields")
        raise_version = not self._state.adding and (
            fields is None or not set(fields) <= self.UNVERSIONED
        )
        if raise_version:
            # In the database, not from the value this object read: a stale copy must not
            # write back a version another writer already wrote.
            self.version = F("version") + 1
            if fields is not None:
                kwargs["update_fields"] = {*fields, "version"}
        super().save(*args, **kwargs)
        if raise_version:
            # Deferred: read again if asked for, and never written back as an expression.
            del self.__dict__["version"]


def stamp(model: type[Versioned]) -> Stamp:
    """The table's stamp: (rows, sum of versions, highest primary key)."""
    found = model._default_manager.order_by().aggregate(
        rows=Count("pk"), versions=Sum("version"), top=Max("pk")
    )
    return (found["rows"], found["versions"] or 0, found["top"] or 0)
