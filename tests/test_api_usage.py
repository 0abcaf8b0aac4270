"""/api/usage/ (JSON and CSV), /api/teams/ and the team and budgets of /api/keys/: what a
script reads and the field errors it gets for what it gets wrong."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from rest_framework.test import APIClient

from deployments.models import AuditEntry
from openai_api.models import ApiKey
from openai_api.usage.models import Team, UsageMinute

NOW = timezone.now().replace(second=0, microsecond=0)
H = (NOW - timedelta(days=2)).replace(hour=10, minute=0)


@pytest.fixture
def staff(db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    return client


def used(minute: Any, deployment: str = "chat", **fields: Any) -> None:
    UsageMinute.objects.create(minute=minute, deployment=deployment, **fields)


def iso(moment: Any) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def csv_of(answer: Any) -> list[list[str]]:
    text = b"".join(answer.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_it_reports_usage_by_key_team_model_and_time(staff: APIClient) -> None:
    team = Team.objects.create(name="research")
    alice, _ = ApiKey.issue("alice", team=team)
    bob, _ = ApiKey.issue("bob")
    used(H, key_id=alice.pk, team_id=team.pk, requests=2, tokens_in=10, tokens_out=5)
    used(H + timedelta(minutes=70), "embed", key_id=bob.pk, requests=4, tokens_in=40)
    used(NOW - timedelta(hours=1), key_id=bob.pk, requests=1, tokens_out=1)
    used(NOW - timedelta(hours=25), key_id=bob.pk, requests=100)
    window = {"since": iso(H), "until": iso(H + timedelta(hours=3))}

    answer = staff.get("/api/usage/", window)
    assert answer.status_code == 200
    body = answer.json()
    assert (body["since"], body["until"], body["by"]) == (window["since"], window["until"], ["key"])
    assert [(r["key"], r["key_prefix"], r["requests"], r["tokens"]) for r in body["rows"]] == [
        ("alice", f"msk-{alice.prefix}", 2, 15),
        ("bob", f"msk-{bob.prefix}", 4, 40),
    ]
    assert (body["totals"]["requests"], body["totals"]["idle_gpu_seconds"]) == (6, 0.0)

    hourly = staff.get("/api/usage/", {**window, "by": "model,hour"}).json()["rows"]
    assert [(r["time"], r["model"], r["requests"]) for r in hourly] == [
        (iso(H), "chat", 2),
        (iso(H + timedelta(hours=1)), "embed", 4),
    ]
    for narrowed in ({"key": f"msk-{bob.prefix}"}, {"key": "bob"}, {"key": str(bob.pk)}):
        rows = staff.get("/api/usage/", {**window, **narrowed, "by": "model"}).json()["rows"]
        assert [(r["model"], r["requests"]) for r in rows] == [("embed", 4)], narrowed
        assert "idle_gpu_seconds" not in rows[0]  # a key's usage has no idle time
    by_team = staff.get("/api/usage/", {**window, "team": "research", "by": "team"}).json()
    assert [(r["team_id"], r["team"], r["requests"]) for r in by_team["rows"]] == [
        (team.pk, "research", 2)
    ]
    assert staff.get("/api/usage/", {**window, "model": "embed"}).json()["totals"]["tokens"] == 40
    # By default the last 24 hours; relative times count back from now.
    recent = staff.get("/api/usage/").json()
    assert [(r["key"], r["requests"]) for r in recent["rows"]] == [("bob", 1)]
    two_days = staff.get("/api/usage/", {"since": "3d", "until": "1d"}).json()["totals"]
    assert two_days["requests"] == 106


def test_it_exports_csv_a_spreadsheet_cannot_run(staff: APIClient) -> None:
    formula, _ = ApiKey.issue('=HYPERLINK("http://evil","x")')
    plus, _ = ApiKey.issue("+1, said they")
    used(H, key_id=formula.pk, requests=1, tokens_in=3, ttft_s=0.5, ttft_count=1)
    used(H, key_id=plus.pk, requests=2, gpu_seconds=1.25)
    window = {"since": iso(H), "until": iso(H + timedelta(hours=1))}

    answer = staff.get("/api/usage/", {**window, "format": "csv"})
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    assert answer["Content-Disposition"] == "attachment; filename=usage.csv"
    header, *rows = csv_of(answer)
    assert header[:6] == ["key_id", "key", "key_prefix", "requests", "errors", "tokens_in"]
    shown = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert shown[str(formula.pk)]["key"] == '\'=HYPERLINK("http://evil","x")'
    assert shown[str(plus.pk)]["key"] == "'+1, said they"
    assert shown[str(formula.pk)]["ttft_mean_s"] == "0.5"
    assert shown[str(plus.pk)]["ttft_mean_s"] == ""  # none measured
    assert shown[str(plus.pk)]["gpu_seconds"] == "1.25"

    accepted = staff.get("/api/usage/", {**window, "by": "model,day"}, HTTP_ACCEPT="text/csv")
    header, *rows = csv_of(accepted)
    assert header[:2] == ["time", "model"] and header[-1] == "idle_gpu_seconds"
    assert rows == [[iso(H.replace(hour=0)), "chat", "3", *rows[0][3:]]]
    empty = csv_of(staff.get("/api/usage/", {"since": "1m", "format": "csv", "by": "team"}))
    assert empty == [[*empty[0][:2], *empty[0][2:]]] and empty[0][:3] == [
        "team_id",
        "team",
        "requests",
    ]


def test_it_answers_bad_usage_parameters_with_field_errors(staff: APIClient) -> None:
    ApiKey.issue("twin")
    ApiKey.issue("twin")
    cases: list[tuple[dict[str, str], str, str]] = [
        ({"since": "yesterday"}, "since", "ISO 8601"),
        ({"until": "2026-13-40"}, "until", "ISO 8601"),
        ({"since": "9999999w"}, "since", "out of range"),
        ({"since": "1h", "until": "2h"}, "until", "later than since"),
        ({"by": "week"}, "by", "'week' is not one of"),
        ({"by": "key,team"}, "by", "At most one of key, team and model"),
        ({"by": "minute", "since": "30d"}, "by", "More than 10,000 minutes"),
        ({"key": "msk-00000000"}, "key", "No key 'msk-00000000'"),
        ({"key": "twin"}, "key", "Several keys are named 'twin'"),
        ({"team": "nobody"}, "team", "No team 'nobody'"),
        ({"key": ""}, "key", "Give a value"),
        ({"by": ""}, "by", "Give a value"),
        ({"model": "x" * 201}, "model", "200"),
        ({"format": "xml"}, "format", "json or csv"),
    ]
    for params, field, says in cases:
        answer = staff.get("/api/usage/", params)
        assert answer.status_code == 400, params
        body = answer.json()
        assert list(body) == [field] and says in body[field][0], (params, body)
    # Errors stay JSON when CSV was asked for.
    refused = staff.get("/api/usage/", {"by": "week"}, HTTP_ACCEPT="text/csv")
    assert refused.status_code == 400 and refused.json() == {"by": [refused.json()["by"][0]]}
    # A deleted key's or team's id is still a filter: its usage outlives it.
    assert staff.get("/api/usage/", {"key": "424242", "team": "4242"}).status_code == 200


def test_it_lets_those_who_may_view_keys_read_usage(db: None) -> None:
    viewer = User.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    operator = User.objects.create_user("operator", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="view_deployment"))
    for user, code in ((viewer, 200), (operator, 403)):
        client = APIClient()
        client.force_authenticate(user)
        assert client.get("/api/usage/").status_code == code, user
    assert APIClient().get("/api/usage/").status_code in (401, 403)


def test_it_manages_teams_and_puts_keys_in_them_by_name(staff: APIClient) -> None:
    made = staff.post("/api/teams/", {"name": "research", "tokens_per_day": 10_000}, format="json")
    assert made.status_code == 201, made.json()
    team = made.json()
    assert (team["keys"], team["tokens_per_day"], team["requests_per_day"]) == (0, 10_000, None)
    assert [s["budget"] for s in team["budget_status"]] == ["tokens_per_day"]

    key = staff.post(
        "/api/keys/",
        {"name": "ci", "team": "research", "tokens_per_day": 1000, "requests_per_day": 50},
        format="json",
    )
    assert key.status_code == 201, key.json()
    body = key.json()
    assert (body["team"], body["tokens_per_day"], body["requests_per_day"]) == (
        "research",
        1000,
        50,
    )
    stored = ApiKey.objects.get(pk=body["id"])
    assert stored.team_id == team["id"]
    used(timezone.now(), key_id=stored.pk, team_id=team["id"], tokens_in=250, requests=5)
    status = staff.get(f"/api/keys/{stored.pk}/").json()["budget_status"]
    assert [(s["budget"], s["used"], s["limit"], s["percent"]) for s in status] == [
        ("tokens_per_day", 250, 1000, 25.0),
        ("requests_per_day", 5, 50, 10.0),
    ]
    assert status[0]["resets_at"].endswith("T00:00:00Z")
    listed = staff.get("/api/teams/").json()["results"]
    assert [(t["name"], t["keys"]) for t in listed] == [("research", 1)]
    assert listed[0]["budget_status"][0]["used"] == 250
    assert [k["name"] for k in staff.get("/api/keys/", {"team": team["id"]}).json()["results"]] == [
        "ci"
    ]

    other = staff.post("/api/teams/", {"name": "ops"}, format="json").json()
    moved = staff.patch(f"/api/keys/{stored.pk}/", {"team": other["id"]}, format="json")
    assert moved.status_code == 200 and moved.json()["team"] == "ops"
    for wrong, says in (("nobody", "No team 'nobody'"), (True, "id or name"), (99999, "No team")):
        refused = staff.patch(f"/api/keys/{stored.pk}/", {"team": wrong}, format="json")
        assert refused.status_code == 400 and says in refused.json()["team"][0], wrong
    renamed = staff.patch(f"/api/teams/{other['id']}/", {"name": "platform"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["keys"] == 1
    assert staff.get(f"/api/keys/{stored.pk}/").json()["team"] == "platform"
    for bad in ({"name": "research"}, {"name": "42"}, {"name": ""}, {"tokens_per_day": -1}):
        refused = staff.post("/api/teams/", {"name": "x", **bad}, format="json")
        assert refused.status_code == 400 and set(refused.json()) == set(bad), bad

    assert staff.delete(f"/api/teams/{other['id']}/").status_code == 204
    stored.refresh_from_db()
    assert stored.team is None and not stored.revoked
    assert staff.patch(f"/api/keys/{stored.pk}/", {"team": None}, format="json").status_code == 200
    actions = AuditEntry.objects.order_by("id").values_list("action", "object_repr")
    assert [a for a, r in actions if r.startswith("team ")] == [
        "team_create",
        "team_create",
        "team_change",
        "team_delete",
    ]
    changed = AuditEntry.objects.filter(action="api_key_change").order_by("id").first()
    assert changed is not None and changed.before is not None and changed.after is not None
    assert (changed.before["team"], changed.after["team"]) == ("research", "ops")


def test_it_leaves_a_keys_team_and_budgets_to_who_may_change_teams(db: None) -> None:
    keeper = User.objects.create_user("keys-only", password="pw-123456", is_staff=True)
    keeper.user_permissions.add(
        *Permission.objects.filter(codename__in=["add_apikey", "change_apikey", "view_apikey"])
    )
    team = Team.objects.create(name="capped", tokens_per_day=1000)
    key, _ = ApiKey.issue("boxed", team=team, tokens_per_day=100)
    api = APIClient()
    api.force_authenticate(keeper)
    lifted = api.patch(
        f"/api/keys/{key.pk}/", {"tokens_per_day": None, "team": None}, format="json"
    )
    assert lifted.status_code == 400
    assert set(lifted.json()) >= {"tokens_per_day", "team"}
    key.refresh_from_db()
    assert (key.team_id, key.tokens_per_day) == (team.pk, 100)
    renamed = api.patch(
        f"/api/keys/{key.pk}/", {"name": "boxed-2", "tokens_per_day": 100}, format="json"
    )
    assert renamed.status_code == 200, renamed.json()  # the same budget sent back: no change
    keeper.user_permissions.add(Permission.objects.get(codename="change_team"))
    keeper = User.objects.get(pk=keeper.pk)  # permissions are cached per user object
    api.force_authenticate(keeper)
    assert (
        api.patch(f"/api/keys/{key.pk}/", {"tokens_per_day": 500}, format="json").status_code == 200
    )


def test_it_lets_no_key_be_created_in_a_team_by_who_may_only_add_keys(db: None) -> None:
    adder = User.objects.create_user("adds-keys", password="pw-123456", is_staff=True)
    adder.user_permissions.add(
        *Permission.objects.filter(codename__in=["add_apikey", "view_apikey"])
    )
    team = Team.objects.create(name="paying", tokens_per_day=1000)
    api = APIClient()
    api.force_authenticate(adder)
    for body in ({"team": team.pk}, {"team": "paying"}, {"tokens_per_day": 10}):
        refused = api.post("/api/keys/", {"name": "spender", **body}, format="json")
        assert refused.status_code == 400 and set(refused.json()) == set(body), body
        assert "permission to change teams" in refused.json()[next(iter(body))][0]
    assert not ApiKey.objects.filter(name="spender").exists()
    plain = api.post("/api/keys/", {"name": "spender", "team": None}, format="json")
    assert plain.status_code == 201 and plain.json()["team"] is None
