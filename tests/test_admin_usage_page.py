"""The admin's usage page (/admin/usage/, openai_api/usage/admin_page.py): tokens and
GPU-seconds over time per team, key or model, the top consumers, the budgets' bars, the idle
GPU-seconds of each model and the CSV of the same; bad ranges as form errors; names escaped.
What a user sees: the HTML, read back."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from deployments.models import Deployment, DeploymentEvent
from openai_api.models import ApiKey
from openai_api.usage.charts import (
    OTHER_COLOUR,
    Series,
    bucket_for,
    bucket_starts,
    figure,
    level_of,
    line_chart,
    polyline_points,
    top_series,
)
from openai_api.usage.models import Team, UsageMinute

if TYPE_CHECKING:
    from django.test import Client

pytestmark = pytest.mark.django_db

# A past hour, whole: the tests that give since and until read from here.
H = (timezone.now() - timedelta(days=3)).replace(hour=10, minute=0, second=0, microsecond=0)
SCRIPT = "<script>alert(1)</script>"


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def staff_with(client: Client, *codenames: str, staff: bool = True) -> Client:
    user = User.objects.create_user("viewer", password="pw-123456", is_staff=staff)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


@pytest.fixture
def viewer(client: Client) -> Client:
    return staff_with(client, "view_apikey")


def used(minute: datetime, deployment: str = "chat", **fields: Any) -> UsageMinute:
    return UsageMinute.objects.create(minute=minute, deployment=deployment, **fields)


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def section(page: str, ident: str) -> str:
    found = re.search(rf'<section class="ms-card" id="{ident}">(.*?)</section>', page, re.S)
    assert found, f"no section {ident}"
    return found.group(1)


def table_rows(page: str) -> list[list[str]]:
    body = section(page, "usage-top").split("<tbody>")[1].split("</tbody>")[0]
    return [
        [text_of(cell).strip() for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def series_of(page: str) -> list[str]:
    return [html.unescape(n) for n in re.findall(r'<polyline data-series="([^"]*)"', page)]


def get(client: Client, **params: str) -> str:
    answer = client.get("/admin/usage/", params)
    assert answer.status_code == 200, answer.content.decode()[:2000]
    return answer.content.decode()


def test_it_lets_only_staff_who_may_view_keys_see_it_and_links_it_from_the_header(
    client: Client,
) -> None:
    assert client.get("/admin/usage/").status_code == 302  # to the login
    staff_with(client, "view_deployment")
    assert client.get("/admin/usage/").status_code == 403
    assert 'href="/admin/usage/"' not in client.get("/admin/").content.decode()
    client.logout()
    User.objects.all().delete()
    staff_with(client, "view_apikey", staff=False)
    answer = client.get("/admin/usage/")
    assert answer.status_code == 302 and "/admin/login/" in answer["Location"]
    client.logout()
    User.objects.all().delete()
    staff_with(client, "view_apikey")
    assert '<a href="/admin/usage/">Usage</a>' in client.get("/admin/").content.decode()
    page = get(client)
    assert "<h1>Usage</h1>" in page and "No usage in this range." in page
    assert "No key or team sets a budget." in text_of(page)


def test_it_shows_the_top_teams_their_series_and_a_link_to_each_and_to_the_csv(
    viewer: Client,
) -> None:
    research = Team.objects.create(name="research")
    ops = Team.objects.create(name="ops")
    ci, _ = ApiKey.issue("ci", team=research)
    batch, _ = ApiKey.issue("batch", team=ops)
    used(
        H + timedelta(minutes=5),
        key_id=ci.pk,
        team_id=research.pk,
        requests=3,
        tokens_in=900,
        tokens_out=300,
        tokens_estimated=300,
        gpu_seconds=12.5,
        errors=1,
    )
    used(
        H + timedelta(minutes=65),
        "embed",
        key_id=ci.pk,
        team_id=research.pk,
        requests=1,
        tokens_in=100,
        gpu_seconds=1,
    )
    used(
        H + timedelta(minutes=10),
        key_id=batch.pk,
        team_id=ops.pk,
        requests=2,
        tokens_in=400,
        tokens_out=100,
        gpu_seconds=30,
    )
    used(H - timedelta(minutes=1), key_id=batch.pk, team_id=ops.pk, tokens_in=10_000)  # before

    page = get(viewer, since=iso(H), until=iso(H + timedelta(hours=2)), by="team")
    summary = text_of(page)
    assert "1,800 tokens · 43.5 GPU-seconds · 6 requests · 1 errors" in summary
    # Most tokens first; tokens, GPU-seconds, requests, errors, estimated share.
    assert table_rows(page) == [
        ["research", "1,300", "13.5", "4", "1", "23%"],
        ["ops", "500", "30.0", "2", "0", "0%"],
    ]
    team_link = re.search(r'<td><a href="([^"]+)">research</a>', page)
    assert team_link is not None
    # Two hours: a point a minute; a line per team in each chart, most first.
    assert "Tokens per minute" in page and "GPU-seconds per minute" in page
    assert series_of(page) == ["research", "ops", "ops", "research"]
    points = re.search(r'data-series="research" stroke="[^"]+" points="([^"]+)"', page)
    assert points is not None and len(points.group(1).split()) == 120
    assert "research 1,300 tokens" in summary and "ops 30.0 GPU-seconds" in summary

    csv_url = re.search(r'id="csv-table" href="([^"]+)"', page)
    assert csv_url is not None
    csv_href = html.unescape(csv_url.group(1))
    assert csv_href.startswith("/api/usage/?format=csv&since=") and "by=team" in csv_href
    csv = viewer.get(csv_href)
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    lines = b"".join(csv.streaming_content).decode().splitlines()  # type: ignore[attr-defined]
    assert lines[0].startswith("team_id,team,") and len(lines) == 3
    series_url = re.search(r'id="csv-series" href="([^"]+)"', page)
    assert series_url is not None and "by=team%2Cminute" in series_url.group(1)

    # The team's link: the page narrowed to it, grouped by key.
    narrowed = viewer.get("/admin/usage/" + html.unescape(team_link.group(1))).content.decode()
    assert "only team research" in text_of(narrowed)
    assert table_rows(narrowed) == [[f"ci (msk-{ci.prefix})", "1,300", "13.5", "4", "1", "23%"]]
    by_model = get(viewer, since=iso(H), until=iso(H + timedelta(hours=2)), by="model")
    assert [row[0] for row in table_rows(by_model)] == ["chat", "embed"]


def test_it_draws_the_top_eight_and_the_rest_as_other_by_hour_for_a_day(
    viewer: Client,
) -> None:
    now = timezone.now().replace(second=0, microsecond=0)
    for n in range(10):
        used(now - timedelta(hours=2), f"model-{n}", tokens_in=100 * (n + 1), requests=1)
    page = get(viewer, by="model")  # the last 24 hours: a point an hour
    assert "Tokens per hour" in page
    tokens = series_of(page)[:9]
    assert tokens == [*(f"model-{n}" for n in range(9, 1, -1)), "other (2 more)"]
    assert "other (2 more) 300 tokens" in text_of(page)
    assert [row[0] for row in table_rows(page)][:3] == ["model-9", "model-8", "model-7"]


def test_it_shows_each_budget_as_a_bar_coloured_past_the_warning_and_at_the_limit(
    viewer: Client, settings: Any
) -> None:
    settings.MSHIP_BUDGET_WARN_PERCENT = 80
    research = Team.objects.create(name="research", tokens_per_month=10_000)
    ci, _ = ApiKey.issue("ci", team=research, tokens_per_day=1000, requests_per_day=4)
    ApiKey.issue("free")  # sets none: not shown
    ApiKey.issue("gone", tokens_per_day=5, revoked=True)  # revoked: not shown
    now = timezone.now().replace(second=0, microsecond=0)
    used(now, key_id=ci.pk, team_id=research.pk, tokens_in=850, requests=4)

    budgets = section(get(viewer), "usage-budgets")
    shown = text_of(budgets)
    assert "team research tokens/month 850 of 10,000 (8%)" in shown
    assert f"key ci (msk-{ci.prefix}) tokens/day 850 of 1,000 (85%)" in shown
    assert "requests/day 4 of 4 (100%)" in shown
    assert "free" not in shown and "gone" not in shown
    tomorrow = (now.astimezone(UTC) + timedelta(days=1)).strftime("%Y-%m-%d 00:00 UTC")
    assert f"(85%) · resets {tomorrow}" in shown
    assert f'<a href="?by=model&amp;key={ci.pk}">ci (msk-{ci.prefix})</a>' in budgets
    levels = re.findall(r'ms-level-(\w+)" style="width: ([\d.]+)%"', budgets)
    assert levels == [("ok", "8.5"), ("warn", "85.0"), ("over", "100.0")]


def test_it_shows_the_load_and_idle_gpu_seconds_of_each_model(viewer: Client) -> None:
    Deployment.objects.create(name="chat", model="simulated", loader="simulated", num_gpus=1)
    for kind, when in (("starting", H - timedelta(hours=1)), ("ready", H + timedelta(minutes=10))):
        event = DeploymentEvent.objects.create(deployment_name="chat", kind=kind)
        DeploymentEvent.objects.filter(pk=event.pk).update(time=when)
    used(H + timedelta(minutes=5), key_id=3, requests=2, gpu_seconds=600, tokens_in=10)
    page = get(viewer, since=iso(H), until=iso(H + timedelta(hours=1)), by="model")
    assert "<th>load GPU-seconds</th><th>idle GPU-seconds</th>" in page
    # Held the hour: 10 minutes of it starting, 600 GPU-seconds used by requests.
    assert table_rows(page) == [["chat", "10", "600.0", "2", "0", "0%", "600.0", "2,400.0"]]
    assert "600.0 loading GPU-seconds" in text_of(page)
    assert "2,400.0 idle GPU-seconds" in text_of(page)
    narrowed = get(viewer, since=iso(H), until=iso(H + timedelta(hours=1)), by="model", key="3")
    assert "<th>idle GPU-seconds</th>" not in narrowed


def test_it_escapes_the_names_of_keys_teams_and_models(viewer: Client) -> None:
    team = Team.objects.create(name=SCRIPT, tokens_per_day=100)
    key, _ = ApiKey.issue(SCRIPT, team=team, tokens_per_day=100)
    now = timezone.now().replace(second=0, microsecond=0)
    used(now, SCRIPT, key_id=key.pk, team_id=team.pk, tokens_in=5, requests=1)
    for by in ("team", "key", "model"):
        page = get(viewer, by=by, model=SCRIPT)
        assert SCRIPT not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert SCRIPT in series_of(page)[0]
        assert table_rows(page)[0][0].startswith(SCRIPT)
    assert f"only model {SCRIPT}" in text_of(page)


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"since": "yesterday"}, "since: ISO 8601"),
        ({"until": "2024-13-45"}, "until: ISO 8601"),
        ({"since": "2d", "until": "3d"}, "until: Must be later than since."),
        ({"since": "2000-01-01"}, "since: At most 400 days"),
        ({"range": "1y"}, "range: Select a valid choice."),
        ({"by": "day"}, "by: Select a valid choice."),
        ({"key": "abc"}, "key: Enter a whole number."),
        ({"since": "9" * 70 + "d"}, "since: Ensure this value has at most 64 characters"),
        ({"since": "9999999w"}, "since: The time is out of range."),
    ],
)
def test_it_tells_a_bad_range_or_grouping_as_a_form_error(
    viewer: Client, params: dict[str, str], error: str
) -> None:
    page = get(viewer, **params)
    errors = re.search(r'<div class="errornote" id="usage-errors">(.*?)</div>', page, re.S)
    assert errors is not None and error in text_of(errors.group(1))
    assert "Top consumers" not in page and 'id="usage-form"' in page


@pytest.mark.parametrize(
    ("span", "bucket", "points"),
    [
        (timedelta(hours=1), "minute", 60),
        (timedelta(hours=6), "minute", 360),
        (timedelta(hours=24), "hour", 24),
        (timedelta(days=7), "hour", 168),
        (timedelta(days=30), "day", 30),
        (timedelta(days=400), "day", 400),
    ],
)
def test_it_picks_a_bucket_that_keeps_a_chart_to_a_few_hundred_points(
    span: timedelta, bucket: str, points: int
) -> None:
    since = datetime(2026, 3, 1, tzinfo=UTC)
    assert bucket_for(span) == bucket
    assert len(bucket_starts(since, since + span, bucket)) == points
    # A range that begins inside a bucket starts with that bucket.
    assert bucket_starts(since + timedelta(seconds=30), since + span, bucket)[0] == since


def test_it_builds_series_of_the_top_names_and_the_rest_summed() -> None:
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    starts = [t0 + timedelta(hours=n) for n in range(3)]
    points = [
        ("a", starts[0], 5.0),
        ("b", starts[1], 7.0),
        ("a", starts[2], 3.0),
        ("c", starts[2], 1.0),
        ("d", starts[0], 2.0),
        ("zero", starts[0], 0.0),
        ("outside", t0 - timedelta(hours=1), 50.0),
    ]
    series = top_series(points, starts, top=2)
    assert [(s.name, s.values, s.other) for s in series] == [
        ("a", (5.0, 0.0, 3.0), False),
        ("b", (0.0, 7.0, 0.0), False),
        ("other (2 more)", (2.0, 0.0, 1.0), True),
    ]
    assert series[-1].colour == OTHER_COLOUR
    assert [s.name for s in top_series(points, starts)] == ["a", "b", "d", "c"]


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (1234567, "tokens", "1,234,567"),
        (12.0, "tokens", "12"),
        (0, "GPU-seconds", "0"),
        (0.125, "GPU-seconds", "0.125"),
        (1234.56, "GPU-seconds", "1,234.6"),
    ],
)
def test_it_writes_figures(value: float, unit: str, shown: str) -> None:
    assert figure(value, unit) == shown


@pytest.mark.parametrize(
    ("percent", "level"), [(0, "ok"), (79.9, "ok"), (80, "warn"), (99.9, "warn"), (100, "over")]
)
def test_it_colours_a_budget_by_its_level(percent: float, level: str) -> None:
    assert level_of(percent, 80) == level


def test_it_draws_a_chart_scaled_to_its_largest_value_escaping_names() -> None:
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    starts = [t0, t0 + timedelta(hours=1), t0 + timedelta(hours=2)]
    assert polyline_points([0, 5, 10], 10) == "0.0,200.0 400.0,100.0 800.0,0.0"
    assert polyline_points([4], 4) == "0.0,0.0 800.0,0.0"
    svg = str(line_chart([Series(SCRIPT, (0, 5, 10), "#000")], starts, "hour", "tokens"))
    assert SCRIPT not in svg and "&lt;script&gt;" in svg
    assert "max 10 tokens per hour" in svg and "03-01 02:00 UTC" in svg
    assert "No tokens in this range." in str(line_chart([], starts, "hour", "tokens"))
