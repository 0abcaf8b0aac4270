"""The admin's landing page and the words it shares with the list, the API and the CLI: the
dashboard's data (the last failures whole, the host's memory, the traffic from the site's
own counters), a deployment's page as an operator reads it, and a start's step while it
prepares. The browser's view of them is tests/test_browser.py's."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User

from common import metrics
from common.traffic import Totals, Traffic, read_totals
from deployments import launch
from deployments.adoption import adopt_all
from deployments.audit import event
from deployments.dashboard import host_memory, last_failures
from deployments.display import state_label
from deployments.models import Deployment
from deployments.transitions import transition

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from django.test import Client


@pytest.fixture
def staff(client: Client, transactional_db: None) -> Client:
    client.force_login(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    return client


def dashboard_of(page: Any) -> dict[str, Any]:
    found = re.search(
        r'<script id="dashboard-data" type="application/json">(.*?)</script>',
        page.content.decode(),
        re.S,
    )
    assert found, "the page has no dashboard"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


@pytest.mark.parametrize(
    ("state", "on_demand", "phase", "start_phase", "launched", "words"),
    [
        ("ready", False, None, "", True, "ready"),
        ("ready", True, "serving", "", True, "ready"),
        ("stopped", True, "sleeping", "", False, "stopped · idle"),
        ("planned", True, "sleeping", "", False, "planned · idle"),
        ("stopped", False, None, "", False, "stopped"),
        ("asleep", True, "sleeping", "", True, "asleep"),
        ("stopped", False, None, "pulling its image", False, "starting · pulling its image"),
        ("failed", True, "failed", "installing (llama)", False, "starting · installing (llama)"),
        ("starting", False, None, "", False, "starting · launching"),
        ("starting", True, "starting_for_request", "", True, "starting · waiting for health"),
        ("stopped", True, "starting_for_request", "", False, "starting · for a request"),
        ("stopped", True, "queued", "", False, "queued · waiting for memory"),
        ("ready", True, "queued", "", True, "ready"),
        ("failed", True, "failed", "", False, "failed"),
        ("failed", True, "queued", "", False, "queued · waiting for memory"),
        ("failed", True, "starting_for_request", "", False, "starting · for a request"),
        ("asleep", True, "starting_for_request", "", True, "waking · for a request"),
        ("stopping", True, "idle", "", True, "stopping"),
    ],
)  # fmt: skip
def test_it_words_every_state_as_the_list_the_api_and_the_cli_do(
    state: str, on_demand: bool, phase: str | None, start_phase: str, launched: bool, words: str
) -> None:
    said = state_label(state, on_demand, phase, start_phase, launched)
    assert said == words
    assert "_" not in said and "sleeping" not in said  # never the raw words


def test_it_opens_the_admin_on_the_dashboard(
    staff: Client, make_deployment: Callable[..., Deployment]
) -> None:
    make_deployment("napper", mode="on_demand", memory_gib=2)
    page = staff.get("/admin/")
    assert page.status_code == 200
    html = page.content.decode()
    data = dashboard_of(page)
    (row,) = data["rows"]
    assert (row["name"], row["label"], row["need_gib"]) == ("napper", "planned · idle", 2.0)
    host = data["host"]
    assert host["capacity_gib"] == 8.0 and host["failures"] == [] and host["reserved"] == []
    assert host["ram"]["total_gib"] > host["ram"]["used_gib"] > 0
    assert isinstance(host["traffic"], list)
    # "View site" leads here, the tab has Modelship's icon, and the deployments come first
    # among the apps (not "Auth Token").
    assert re.search(r'<a href="/admin/">View site</a>', html)
    assert 'rel="icon"' in html and "modelship/favicon.svg" in html
    assert html.index(">Deployments</a>") < html.index("Authentication and Authorization")
    assert staff.get("/favicon.ico").headers["Location"].endswith("modelship/favicon.svg")


def test_it_shows_no_dashboard_to_staff_who_may_not_view_deployments(
    client: Client, transactional_db: None, make_deployment: Callable[..., Deployment]
) -> None:
    make_deployment("secretive")
    clerk = User.objects.create_user("clerk", password="pw-123456", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="view_user"))
    client.force_login(clerk)
    page = client.get("/admin/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "dashboard-data" not in html and "secretive" not in html
    assert ">Users</a>" in html  # what they may see is still there


def test_it_shows_the_failures_only_to_who_may_view_deployment_events(
    client: Client, transactional_db: None, make_deployment: Callable[..., Deployment]
) -> None:
    event(make_deployment("broken"), "failed", "the engine exited with code 3")
    watcher = User.objects.create_user("watcher", password="pw-123456", is_staff=True)
    watcher.user_permissions.add(Permission.objects.get(codename="view_deployment"))
    client.force_login(watcher)
    data = dashboard_of(client.get("/admin/"))
    assert data["rows"][0]["name"] == "broken" and data["host"]["failures"] is None
    watcher.user_permissions.add(Permission.objects.get(codename="view_deploymentevent"))
    watcher = User.objects.get(pk=watcher.pk)  # permissions are cached per user object
    client.force_login(watcher)
    (failure,) = dashboard_of(client.get("/admin/"))["host"]["failures"]
    assert failure["reason"] == "the engine exited with code 3"


def test_it_shows_a_ray_cluster_without_the_credentials_in_its_address(
    staff: Client, settings: Any
) -> None:
    settings.MSHIP_RAY_ADDRESS = "http://ops:hunter2@127.0.0.1:9"  # nothing listens there
    html = staff.get("/admin/").content.decode()
    assert "Ray cluster at http://********@127.0.0.1:9" in html and "Not reachable" in html
    assert "hunter2" not in html


def test_it_keeps_the_last_failures_whole(
    staff: Client, make_deployment: Callable[..., Deployment]
) -> None:
    broken = make_deployment("broken")
    reason = "the engine exited with code 3 during start-up\n" + "x" * 5000 + " END"
    for n in range(7):
        event(broken, "failed", f"{n}: {reason}")
    event(broken, "start_refused", "it needs 9 GiB; 8 GiB free")
    event(broken, "ready")
    failures = last_failures()
    assert [f["kind"] for f in failures] == ["start refused", *["failed"] * 4]
    assert failures[1]["reason"] == f"6: {reason}" and failures[1]["id"] == broken.pk
    assert dashboard_of(staff.get("/admin/"))["host"]["failures"][1]["reason"].endswith(" END")


def test_it_reads_the_hosts_memory_where_the_kernel_tells(tmp_path: Path) -> None:
    told = tmp_path / "meminfo"
    told.write_text("MemTotal:       16777216 kB\nMemFree: 1 kB\nMemAvailable:    4194304 kB\n")
    assert host_memory(told) == {"total_gib": 16.0, "used_gib": 12.0}
    told.write_text("MemTotal:       16777216 kB\n")  # an old kernel: no MemAvailable
    assert host_memory(told) is None
    assert host_memory(tmp_path / "missing") is None


def test_it_counts_the_sites_requests_and_tokens_from_its_counter_files() -> None:
    before = read_totals()
    metrics.requests.labels("chat", "chat", "200", "").inc()
    metrics.tokens.labels("chat", "in", "", "").inc(7)
    metrics.tokens.labels("chat", "out", "", "").inc(5)
    after = read_totals()
    assert after.requests - before.requests == 1
    assert after.tokens - before.tokens == 12


def test_it_charts_rates_between_samples_and_starts_again_after_a_restart() -> None:
    now = [1000.0]
    readings: Iterator[Totals | OSError] = iter(
        [Totals(0, 0), Totals(20, 1000), Totals(20, 1000), Totals(5, 50), OSError("torn file")]
    )

    def read() -> Totals:
        reading = next(readings)
        if isinstance(reading, Exception):
            raise reading
        return reading

    traffic = Traffic(read=read, clock=lambda: now[0])
    for _ in range(5):
        traffic.sample()  # the last one fails to read: nothing is added
        now[0] += 10
    assert traffic.series() == [
        {"at": 1010.0, "rps": 2.0, "tps": 100.0},
        {"at": 1020.0, "rps": 0.0, "tps": 0.0},
        {"at": 1030.0, "rps": 0.0, "tps": 0.0},  # counters went down: the site restarted
    ]
    for _ in range(200):  # it keeps 15 minutes of samples, no more
        traffic.samples.append(traffic.samples[-1])
    assert len(traffic.samples) == 91


def test_it_shows_a_deployments_page_in_an_operators_words(
    staff: Client, make_deployment: Callable[..., Deployment]
) -> None:
    added = staff.get("/admin/deployments/deployment/add/").content.decode()
    # The add form: no state section; the loader's options right after the loader.
    assert "Engines:" not in added and ">State<" not in added
    assert added.index("simulated options") < added.index(">Engine<")
    for label in ("Memory (GiB)", "GPUs", "Idle timeout (s)", "Use case"):
        assert f">{label}:</label>" in added, label

    running = make_deployment(
        "talker",
        state="ready",
        engine_urls=["http://127.0.0.1:9"],
        state_reason="first line of why\n" + "y" * 400,
        runtime_handle={
            "replicas": [
                {"runtime": "process", "replica": 0, "pid": 4242, "url": "http://127.0.0.1:9"}
            ]
        },
    )
    page = staff.get(f"/admin/deployments/deployment/{running.pk}/change/").content.decode()
    assert "replica 0 · process" in page and "<th>process id</th><td>4242</td>" in page
    assert "<th>engine address</th><td>http://127.0.0.1:9</td>" in page
    assert '{"replicas"' not in page and "&quot;replicas&quot;" not in page
    # The whole reason, folded under its first line.
    assert re.search(
        r"<summary>first line of why</summary><pre>first line of why\ny{400}</pre>", page
    )
    assert "Mode switch waiting:" in page


def test_it_says_what_a_start_is_doing_while_it_prepares(
    make_deployment: Callable[..., Deployment],
) -> None:
    deployment = make_deployment("puller", state="stopped", mode="on_demand")
    launch.told(deployment, "pulling its container image")("Pulling: 40% of 2.1 GB")
    deployment.refresh_from_db()
    assert deployment.state_reason == "Pulling: 40% of 2.1 GB"
    assert deployment.start_phase == "pulling its container image"
    launch.prepare_start(deployment)  # a simulated engine needs nothing more: done preparing
    assert Deployment.objects.get(pk=deployment.pk).start_phase == ""
    # A start whose worker died while it pulled: the next state change ends the step.
    launch.told(deployment, "pulling its container image")("Pulling: 90%")
    transition(deployment, "failed", expected=["stopped"], reason="the pull was cut off")
    assert Deployment.objects.get(pk=deployment.pk).start_phase == ""


@pytest.mark.usefixtures("engines")
def test_it_forgets_a_preparing_start_whose_process_died(
    make_deployment: Callable[..., Deployment],
) -> None:
    make_deployment("orphaned", state="stopped", start_phase="installing its engine environment")
    adopt_all()
    assert Deployment.objects.get(name="orphaned").start_phase == ""
