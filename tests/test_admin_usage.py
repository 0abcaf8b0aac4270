"""The admin's teams and the budgets of keys and teams: set in a "Budgets" section, listed with
how much of each is used ("tokens/day 250 of 1,000 (25%)"), every team change audited."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from deployments.models import AuditEntry
from openai_api.models import ApiKey
from openai_api.usage.models import Team, UsageMinute

if TYPE_CHECKING:
    from django.test import Client


@pytest.fixture
def staff(client: Client, db: None) -> Client:
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw-123456"))
    return client


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_it_manages_teams_and_shows_what_keys_and_teams_used_of_their_budgets(
    staff: Client,
) -> None:
    made = staff.post(
        "/admin/openai_api/team/add/",
        {"name": "research", "description": "", "tokens_per_month": "1000000"},
    )
    assert made.status_code == 302, made.content.decode()[:2000]
    team = Team.objects.get(name="research")
    added = staff.post(
        "/admin/openai_api/apikey/add/",
        {
            "name": "ci",
            "allowed_models": "[]",
            "team": team.pk,
            "tokens_per_day": "1000",
            "requests_per_day": "",
        },
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    key = ApiKey.objects.get(name="ci")
    assert (key.team, key.tokens_per_day, key.requests_per_day) == (team, 1000, None)
    UsageMinute.objects.create(
        minute=timezone.now(), key_id=key.pk, team_id=team.pk, tokens_in=200, tokens_out=50
    )

    keys = text_of(staff.get("/admin/openai_api/apikey/").content.decode())
    assert "research" in keys and "tokens/day 250 of 1,000 (25%)" in keys
    page = staff.get(f"/admin/openai_api/apikey/{key.pk}/change/").content.decode()
    assert "Budgets" in page and 'name="gpu_seconds_per_month"' in page
    assert "tokens/day 250 of 1,000 (25%)" in text_of(page)
    teams = text_of(staff.get("/admin/openai_api/team/").content.decode())
    assert "research 1 tokens/month 250 of 1,000,000 (0%)" in teams

    changed = staff.post(
        f"/admin/openai_api/team/{team.pk}/change/",
        {"name": "research", "description": "the lab", "tokens_per_month": "500"},
    )
    assert changed.status_code == 302
    team.refresh_from_db()
    assert (team.description, team.tokens_per_month) == ("the lab", 500)
    teams = text_of(staff.get("/admin/openai_api/team/").content.decode())
    assert "tokens/month 250 of 500 (50%)" in teams
    removed = staff.post(f"/admin/openai_api/team/{team.pk}/delete/", {"post": "yes"})
    assert removed.status_code == 302 and not Team.objects.exists()
    key.refresh_from_db()
    assert key.team is None
    actions = AuditEntry.objects.filter(action__startswith="team_").order_by("id")
    assert [a.action for a in actions] == ["team_create", "team_change", "team_delete"]
    assert actions[1].before == {**actions[0].after, "tokens_per_month": 1_000_000}  # type: ignore[dict-item]
    assert actions[1].after["tokens_per_month"] == 500  # type: ignore[index]
