"""Usage read back (openai_api/usage/report.py): rows summed by key, team and model, by
minute, hour and day; a model's idle GPU-seconds from its state events; the top consumers;
how much of its budgets a key or a team used this day and month, and when that resets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from deployments.models import Deployment, DeploymentEvent
from openai_api.models import ApiKey
from openai_api.usage.models import Team, UsageMinute
from openai_api.usage.report import (
    budget_status,
    budget_text,
    check_by,
    idle_gpu_seconds,
    top_consumers,
    usage_rows,
    usage_totals,
)

pytestmark = pytest.mark.django_db

# A past hour, whole: every test's times are from here.
H = (timezone.now() - timedelta(days=3)).replace(hour=10, minute=0, second=0, microsecond=0)


def used(minute: datetime, deployment: str = "chat", **fields: Any) -> UsageMinute:
    return UsageMinute.objects.create(minute=minute, deployment=deployment, **fields)


def entered(name: str, kind: str, time: datetime) -> None:
    """A state event at a time of the test's choosing (`time` is set on creation)."""
    event = DeploymentEvent.objects.create(deployment_name=name, kind=kind)
    DeploymentEvent.objects.filter(pk=event.pk).update(time=time)


def deployment(name: str, **fields: Any) -> Deployment:
    return Deployment.objects.create(name=name, model="simulated", loader="simulated", **fields)


def picked(rows: list[dict[str, Any]], *names: str) -> list[tuple[Any, ...]]:
    return [tuple(row[name] for name in names) for row in rows]


def test_it_sums_usage_per_key_team_and_model_naming_deleted_ones() -> None:
    team = Team.objects.create(name="research")
    alice, _ = ApiKey.issue("alice", team=team)
    bob, _ = ApiKey.issue("bob")
    gone, _ = ApiKey.issue("gone", team=team)
    common: dict[str, Any] = {
        "tokens_cached": 2,
        "tokens_estimated": 1,
        "images": 1,
        "characters": 7,
    }
    used(H, key_id=alice.pk, team_id=team.pk, requests=2, tokens_in=10, tokens_out=5, **common)
    used(
        H + timedelta(minutes=3),
        key_id=alice.pk,
        team_id=team.pk,
        requests=1,
        errors=1,
        tokens_in=1,
        ttft_s=0.75,
        ttft_count=3,
        gpu_seconds=1.5,
        audio_s=2.25,
        duration_s=4,
    )
    used(H + timedelta(minutes=4), "embed", key_id=bob.pk, requests=4, tokens_in=40)
    used(H + timedelta(minutes=5), "embed", key_id=gone.pk, team_id=team.pk, requests=1)
    used(H + timedelta(minutes=6), "embed", team_id=99, requests=1)  # no key; a deleted team
    used(H + timedelta(hours=1), key_id=alice.pk, requests=100)  # after `until`
    gone_id = gone.pk
    gone.delete()
    until = H + timedelta(hours=1)

    rows = usage_rows(H, until, by=("key",))
    assert picked(rows, "key", "key_prefix", "requests", "tokens") == [
        ("(no key)", "", 1, 0),
        ("alice", f"msk-{alice.prefix}", 3, 16),
        ("bob", f"msk-{bob.prefix}", 4, 40),
        (f"key #{gone_id} (deleted)", "", 1, 0),
    ]
    mine = rows[1]
    assert mine["key_id"] == alice.pk
    assert (mine["errors"], mine["tokens_in"], mine["tokens_out"]) == (1, 11, 5)
    assert (mine["tokens_cached"], mine["tokens_estimated"], mine["images"]) == (2, 1, 1)
    assert (mine["gpu_seconds"], mine["audio_s"], mine["duration_s"]) == (1.5, 2.25, 4.0)
    assert mine["ttft_mean_s"] == 0.25 and rows[2]["ttft_mean_s"] is None  # none measured
    assert "idle_gpu_seconds" not in mine

    by_team = usage_rows(H, until, by=("team",))
    assert picked(by_team, "team_id", "team", "requests") == [
        (0, "(no team)", 4),
        (team.pk, "research", 4),
        (99, "team #99 (deleted)", 1),
    ]
    by_model = usage_rows(H, until, by=("model",))
    assert picked(by_model, "model", "requests", "idle_gpu_seconds") == [
        ("chat", 3, 0.0),
        ("embed", 6, 0.0),
    ]
    assert picked(usage_rows(H, until, by=("model",), key_id=bob.pk), "model", "requests") == [
        ("embed", 4)
    ]
    narrowed = usage_rows(H, until, by=("key",), team_id=team.pk, deployment="chat")
    assert picked(narrowed, "key", "requests") == [("alice", 3)]
    totals = usage_totals(H, until)
    assert (totals["requests"], totals["tokens"], totals["idle_gpu_seconds"]) == (9, 56, 0.0)
    assert "idle_gpu_seconds" not in usage_totals(H, until, key_id=bob.pk)


def test_it_groups_by_minute_hour_and_day() -> None:
    used(H + timedelta(minutes=5), requests=1, tokens_out=3)
    used(H + timedelta(minutes=5), key_id=7, requests=2, tokens_out=4)
    used(H + timedelta(minutes=59), "embed", requests=4)
    used(H + timedelta(minutes=70), requests=8)
    used(H + timedelta(days=1), requests=16)
    until = H + timedelta(days=2)

    hourly = usage_rows(H, until, by=("hour",))
    assert picked(hourly, "time", "requests", "tokens_out") == [
        (H, 7, 7),
        (H + timedelta(hours=1), 8, 0),
        (H + timedelta(days=1), 16, 0),
    ]
    assert set(hourly[0]) == {"time", *usage_rows(H, until, by=("key",))[0]} - {
        "key_id",
        "key",
        "key_prefix",
    }
    by_minute = usage_rows(H, H + timedelta(hours=1), by=("minute",))
    assert picked(by_minute, "time", "requests") == [
        (H + timedelta(minutes=5), 3),
        (H + timedelta(minutes=59), 4),
    ]
    daily = usage_rows(H, until, by=("model", "day"), key_id=0)
    day = H.replace(hour=0)
    assert picked(daily, "time", "model", "requests") == [
        (day, "chat", 9),
        (day, "embed", 4),
        (day + timedelta(days=1), "chat", 16),
    ]
    for wrong, says in [
        (("key", "team"), "At most one of key, team and model"),
        (("hour", "day"), "At most one of minute, hour and day"),
        (("week",), "'week' is not one of"),
        (("key", "key"), "at most once"),
    ]:
        with pytest.raises(ValueError, match=says):
            check_by(wrong, H, until)
    with pytest.raises(ValueError, match="More than 10,000 minutes"):
        check_by(("minute",), H, H + timedelta(days=7))


def test_it_counts_a_models_idle_gpu_seconds_from_its_state_events() -> None:
    chat = deployment("chat", num_gpus=1, num_replicas=2)  # two GPUs held while it runs
    deployment("quiet", num_gpus=0.5)
    deployment("cpu", num_gpus=0)  # no GPU: never idle GPU time
    entered("chat", "ready", H - timedelta(hours=1))  # ready when the report begins
    entered("chat", "stopped", H + timedelta(minutes=10))
    entered("chat", "start_refused", H + timedelta(minutes=20))  # no state: changes nothing
    entered("chat", "starting", H + timedelta(minutes=30))
    entered("chat", "ready", H + timedelta(minutes=31))  # a minute's start: its load
    entered("chat", "asleep", H + timedelta(minutes=70))  # a sleeping engine holds none
    entered("chat", "waking", H + timedelta(minutes=110))  # a wake: held, and a load
    entered("chat", "ready", H + timedelta(minutes=111))
    entered("chat", "stopping", H + timedelta(minutes=115))
    entered("chat", "stopped", H + timedelta(minutes=116))
    entered("quiet", "starting", H + timedelta(minutes=90))
    entered("quiet", "ready", H + timedelta(minutes=100))
    entered("cpu", "ready", H)
    used(H + timedelta(minutes=5), key_id=3, requests=2, gpu_seconds=800)
    until = H + timedelta(hours=2)

    # Held [H, H+10m), [H+30m, H+70m) and [H+110m, H+116m): 56 minutes on 2 GPUs is 6,720
    # GPU-s; of them 2 minutes loading (240) and 800 used by requests.
    assert idle_gpu_seconds(chat, H, until) == 5680
    by_model = usage_rows(H, until, by=("model",))
    columns = ("model", "requests", "gpu_seconds", "load_gpu_seconds", "idle_gpu_seconds")
    assert picked(by_model, *columns) == [
        ("chat", 2, 800.0, 240.0, 5680.0),
        # Half a GPU for its last 30 minutes: 10 starting, 20 ready with no request.
        ("quiet", 0, 0.0, 300.0, 600.0),
    ]
    hourly = usage_rows(H, until, by=("model", "hour"))
    assert picked(hourly, "time", "model", "load_gpu_seconds", "idle_gpu_seconds") == [
        (H, "chat", 120.0, 3880.0),  # 40 minutes held, 1 starting, 800 used
        (H + timedelta(hours=1), "chat", 120.0, 1800.0),  # 10 + 6 held, 1 waking
        (H + timedelta(hours=1), "quiet", 300.0, 600.0),
    ]
    totals = usage_totals(H, until)
    assert (totals["load_gpu_seconds"], totals["idle_gpu_seconds"]) == (540, 6280)
    assert usage_totals(H, until, deployment="quiet")["idle_gpu_seconds"] == 600
    assert "idle_gpu_seconds" not in usage_rows(H, until, by=("model",), key_id=3)[0]
    # Used more than held (a figure is never below 0); a range before any event: nothing.
    used(H + timedelta(minutes=95), "quiet", gpu_seconds=5000)
    assert idle_gpu_seconds(Deployment.objects.get(name="quiet"), H, until) == 0
    assert idle_gpu_seconds(chat, H - timedelta(days=9), H - timedelta(days=8)) == 0
    # Still held now: counted up to now, not to an `until` in the future.
    now = timezone.now()
    live = deployment("live", num_gpus=1)
    entered("live", "ready", now - timedelta(hours=1))
    assert 3590 < idle_gpu_seconds(live, now - timedelta(hours=1), now + timedelta(days=1)) < 3700


def test_it_ranks_the_top_consumers() -> None:
    used(H, key_id=1, tokens_in=10, gpu_seconds=9)
    used(H, key_id=2, tokens_in=30, gpu_seconds=1)
    used(H, key_id=3, requests=1)
    used(H, "embed", key_id=2, tokens_out=5)
    until = H + timedelta(hours=1)
    assert picked(top_consumers(H, until, "key", 2), "key_id", "tokens") == [(2, 35), (1, 10)]
    by_gpu = top_consumers(H, until, "key", metric="gpu_seconds")
    assert picked(by_gpu, "key_id") == [(1,), (2,)]  # key 3 used none
    assert picked(top_consumers(H, until, "model"), "model", "tokens") == [
        ("chat", 40),
        ("embed", 5),
    ]
    with pytest.raises(ValueError):
        top_consumers(H, until, "hour")


def test_it_tells_how_much_of_each_budget_is_used_and_when_it_resets() -> None:
    now = datetime(2026, 3, 15, 12, 30, tzinfo=UTC)
    team = Team.objects.create(name="research", tokens_per_month=1_000_000)
    key, _ = ApiKey.issue(
        "ci", team=team, tokens_per_day=10_000, requests_per_day=10, gpu_seconds_per_month=100
    )
    other, _ = ApiKey.issue("other", team=team)
    today = datetime(2026, 3, 15, 1, 7, tzinfo=UTC)
    used(today, key_id=key.pk, team_id=team.pk, requests=3, tokens_in=1000, tokens_out=234)
    used(today, key_id=other.pk, team_id=team.pk, requests=1, tokens_in=66)
    used(
        datetime(2026, 3, 2, tzinfo=UTC),
        key_id=key.pk,
        team_id=team.pk,
        requests=5,
        tokens_in=5000,
        gpu_seconds=42,
    )
    used(
        datetime(2026, 2, 28, 23, 59, tzinfo=UTC),
        key_id=key.pk,
        team_id=team.pk,
        requests=50,
        tokens_in=9999,
        gpu_seconds=99,
    )  # last month

    status = budget_status(key, now=now)
    assert [(s["budget"], s["used"], s["limit"], s["percent"]) for s in status] == [
        ("tokens_per_day", 1234, 10_000, 12.3),
        ("gpu_seconds_per_month", 42.0, 100, 42.0),
        ("requests_per_day", 3, 10, 30.0),
    ]
    assert status[0]["resets_at"] == datetime(2026, 3, 16, tzinfo=UTC)
    assert status[1]["resets_at"] == datetime(2026, 4, 1, tzinfo=UTC)
    assert (status[0]["counts"], status[0]["period"]) == ("tokens", "day")
    assert budget_text(status) == [
        "tokens/day 1,234 of 10,000 (12%)",
        "GPU-s/month 42 of 100 (42%)",
        "requests/day 3 of 10 (30%)",
    ]
    (team_status,) = budget_status(team, now=now)
    assert (team_status["used"], team_status["percent"]) == (6300, 0.6)  # both keys'
    # A live figure the caller has (the gateway's) is taken as it is.
    live = budget_status(key, {"tokens_per_day": 25_000}, now=now)
    assert (live[0]["used"], live[0]["percent"], live[2]["used"]) == (25_000, 250.0, 0)
    december = budget_status(team, now=datetime(2026, 12, 31, 23, 59, tzinfo=UTC))
    assert december[0]["resets_at"] == datetime(2027, 1, 1, tzinfo=UTC)
    assert budget_status(other, now=now) == []  # sets none
