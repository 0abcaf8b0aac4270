"""Budgets near or at their limit: the budget metric, a log line and one audit entry per
owner, budget and period at MSHIP_BUDGET_WARN_PERCENT ("budget.warning") and at 100%
("budget.exceeded"), however many gateway processes see it."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DatabaseError

from common import metrics
from deployments.audit import record
from deployments.models import AuditEntry
from openai_api.usage.budgets import UNITS, Budgets, Owner

log = logging.getLogger(__name__)
said: set[tuple[str, str, str, str]] = set()  # (ref, field, period name, action) said here


def look(budgets: Budgets) -> None:
    periods = budgets.periods()
    for owner in list(budgets.watched.values()):
        for field, what, period, limit in owner.limits:
            period_name = periods[period]
            used = budgets.used((owner.ref, what, period_name))
            ratio = used / limit if limit else 1.0
            metrics.budget_used.labels(f"{owner.kind}:{owner.id}", owner.name, field).set(ratio)
            if ratio >= 1:
                say(owner, field, what, period_name, used, limit, "budget.exceeded")
            elif ratio * 100 >= settings.MSHIP_BUDGET_WARN_PERCENT:
                say(owner, field, what, period_name, used, limit, "budget.warning")


def say(
    owner: Owner, field: str, what: str, period_name: str, used: float, limit: int, action: str
) -> None:
    mark = (owner.ref, field, period_name, action)
    if mark in said:
        return
    said.add(mark)
    subject = f"{owner.kind} {owner.name}"
    text = f"{field} {period_name}: {used:,.0f} of {limit:,} {UNITS[what]} ({used / limit:.0%})"
    log.warning("%s: %s %s", action, subject, text)
    try:
        # Once per site: another process may have said it first.
        if not AuditEntry.objects.filter(
            action=action, object_repr=subject, text__startswith=f"{field} {period_name}:"
        ).exists():
            record(action, None, actor="budgets", object_repr=subject, text=text)
    except DatabaseError as exc:
        said.discard(mark)  # said again at the next look
        log.warning("could not audit %s of %s: %s", action, subject, exc)
