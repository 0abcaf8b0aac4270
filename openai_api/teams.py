"""The one door for teams: made, changed and removed here, audited (`team_create`,
`team_change`, `team_delete`), whichever of the admin and /api/teams/ asks. Removing a team
leaves its keys without one; its usage rows keep its id."""

from __future__ import annotations

from typing import Any

from deployments import audit
from openai_api.usage.models import BUDGETS, Team


def snapshot(team: Team) -> dict[str, Any]:
    return {
        "name": team.name,
        "description": team.description,
        **{field: getattr(team, field) for field, _, _ in BUDGETS},
    }


def record(user: Any, team: Team, action: str, before: dict[str, Any] | None) -> None:
    after = None if action == "team_delete" else snapshot(team)
    audit.record(action, None, user=user, before=before, after=after, object_repr=f"team {team}")


def create(user: Any, **fields: Any) -> Team:
    team = Team(**fields)
    team.full_clean()
    team.save()
    record(user, team, "team_create", None)
    return team


def change(user: Any, team: Team, **fields: Any) -> Team:
    before = snapshot(Team.objects.get(pk=team.pk))
    for field, value in fields.items():
        setattr(team, field, value)
    team.full_clean()
    team.save()
    team.refresh_from_db()
    record(user, team, "team_change", before)
    return team


def delete(user: Any, team: Team) -> None:
    before = snapshot(team)
    team.delete()
    record(user, team, "team_delete", before)
