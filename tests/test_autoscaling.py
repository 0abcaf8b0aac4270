"""Replicas that follow load: the autoscaling_config (checked as Ray Serve's), the decision
with its delays, and the autoscaler on real simulated engines: up under load within the
memory budget, down one idle replica at a time, never cutting a request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from deployments import deployer, operations, scaling
from deployments.autoscaler import Autoscaler
from deployments.autoscaling import AutoscalingConfig, Decider, problems
from deployments.models import AuditEntry, Deployment, DeploymentEvent, Mode, State
from tests.conftest import as_gateway, in_thread, wait_until

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

SCALING = {
    "min_replicas": 1,
    "max_replicas": 3,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 0,
    "downscale_delay_s": 0,
}
SLOW = {"reply": "word " * 12, "tokens_per_second": 6}


# --- the config and the decision -------------------------------------------------------------


pytestmark = [pytest.mark.postgres]


def test_it_takes_ray_serves_form_and_refuses_what_it_cannot_mean() -> None:
    assert problems(SCALING) == []
    assert problems({"max_replicas": 2, "min_replicas": 3, "bogus": 1, "upscale_delay_s": -1}) == [
        "unknown key 'bogus'",
        "upscale_delay_s: must be a number from 0, not -1",
        "min_replicas: more than max_replicas",
    ]
    assert problems({"min_replicas": 1}) == ["max_replicas: required"]
    assert problems({"max_replicas": 65, "target_ongoing_requests": 0}) == [
        "max_replicas: at most 64",
        "target_ongoing_requests: must be above 0",
    ]
    assert problems({"max_replicas": 2.5}) == [
        "max_replicas: must be a whole number from 1, not 2.5"
    ]


def test_it_asks_for_the_replicas_the_load_needs_within_bounds() -> None:
    config = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=2)
    assert [config.desired(load) for load in (0, 1, 2, 2.5, 7, 100)] == [1, 1, 1, 2, 4, 4]
    assert AutoscalingConfig(min_replicas=0, max_replicas=3).initial == 1
    assert AutoscalingConfig(min_replicas=2, max_replicas=3, initial_replicas=3).initial == 3


def test_it_changes_the_count_only_once_the_wish_has_held_for_its_delay() -> None:
    config = AutoscalingConfig(
        min_replicas=1, max_replicas=4, target_ongoing_requests=1, upscale_delay_s=30
    )
    decider = Decider()
    assert decider.decide(1, config, running=1, ongoing=3, now=0) is None
    assert decider.decide(1, config, running=1, ongoing=3, now=29) is None
    assert decider.decide(1, config, running=1, ongoing=0, now=30) is None  # a lull: restart
    assert decider.decide(1, config, running=1, ongoing=4, now=31) is None
    assert decider.decide(1, config, running=1, ongoing=4, now=61) == 4
    assert decider.decide(1, config, running=4, ongoing=0, now=62) is None  # downscale: 600 s
    assert decider.decide(1, config, running=4, ongoing=0, now=662) == 1


def test_it_makes_min_replicas_zero_on_demand_and_checks_the_api(
    transactional_db: None, make_deployment: Callable[..., Deployment]
) -> None:
    to_zero = make_deployment("zero", autoscaling_config={"min_replicas": 0, "max_replicas": 2})
    assert to_zero.effective_mode == Mode.ON_DEMAND and to_zero.is_on_demand
    api = APIClient()
    api.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw"))
    body = {"name": "x", "model": "simulated", "loader": "simulated", "memory_gib": 1}
    answer = api.post(
        "/api/deployments/",
        {**body, "mode": "always_on", "num_replicas": 2, "autoscaling_config": {"min_replicas": 0}},
        format="json",
    )
    assert answer.status_code == 400
    assert answer.json()["autoscaling_config"] == [
        "max_replicas: required",
        "min_replicas 0 is on demand: not with always on",
    ]
    assert answer.json()["num_replicas"] == ["give num_replicas or autoscaling_config, not both"]
    made = api.post("/api/deployments/", {**body, "autoscaling_config": SCALING}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["autoscaling_config"] == SCALING and made.json()["replicas"] == 0


def test_it_keeps_a_deployment_that_scales_to_zero_on_demand_when_its_mode_is_unset(
    transactional_db: None, make_deployment: Callable[..., Deployment]
) -> None:
    """Clearing the mode of a deployment that scales to zero changes nothing it runs as:
    unset reads as on demand there, so it is no switch to always on."""
    zero = make_deployment(
        "zero", mode=Mode.ON_DEMAND, autoscaling_config={"min_replicas": 0, "max_replicas": 2}
    )
    zero.mode = None
    saved = operations.update(zero, None, actor="test", work=lambda *args: None)
    saved.refresh_from_db()
    assert (saved.mode, saved.effective_mode) == (None, Mode.ON_DEMAND)
    assert not AuditEntry.objects.filter(action="ondemand_mode").exists()


# --- the autoscaler on real engines ----------------------------------------------------------


def busy(url: str, streams: int) -> list[threading.Thread]:
    """`streams` slow requests straight at an engine, each on its own thread."""
    auth = as_gateway.now()

    def ask() -> None:
        httpx.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            timeout=60,
            auth=auth,
        ).raise_for_status()

    return [in_thread(ask) for _ in range(streams)]


def running(deployment: Deployment) -> int:
    return sum(
        httpx.get(url + "/sim/stats").json()["running"] for url in fresh(deployment).engine_urls
    )


def fresh(deployment: Deployment) -> Deployment:
    deployment.refresh_from_db()
    return deployment


@pytest.mark.usefixtures("engines")
def test_it_adds_replicas_under_load_and_removes_them_one_idle_replica_at_a_time(
    make_deployment: Callable[..., Deployment], site: Any
) -> None:
    site.MSHIP_DRAIN_GRACE_S = 0.1
    # Requests of 6 s: they outlast the two replicas' starts on a loaded host.
    longer = {**SLOW, "reply": "word " * 36}
    scaled = make_deployment("scaled", autoscaling_config=SCALING, config=longer)
    deployer.restart(scaled.pk)
    assert (fresh(scaled).state, len(scaled.engine_urls), scaled.replica_count) == ("ready", 1, 1)
    autoscaler = Autoscaler()
    load = busy(scaled.engine_urls[0], 3)
    wait_until(lambda: running(scaled) == 3, 10)
    assert autoscaler.tick() == ["scaled: one replica more"] * 2
    assert (len(fresh(scaled).engine_urls), scaled.replicas) == (3, 3)
    assert [h["replica"] for h in scaled.runtime_handle["replicas"]] == [0, 1, 2]
    for url in scaled.engine_urls:
        assert httpx.get(url + "/health").status_code == 200
    assert running(scaled) == 3  # the load is still there
    assert autoscaler.tick() == []  # as many as the load asks for
    for thread in load:
        thread.join(30)
    assert autoscaler.tick() == ["scaled: one replica less"]
    assert autoscaler.tick() == ["scaled: one replica less"]
    assert autoscaler.tick() == []  # never below min_replicas
    assert (len(fresh(scaled).engine_urls), scaled.replicas) == (1, 1)
    kinds = list(
        DeploymentEvent.objects.filter(deployment=scaled, kind__startswith="scaled")
        .order_by("pk")
        .values_list("kind", "text")
    )
    assert [k for k, _ in kinds] == ["scaled_up", "scaled_up", "scaled_down", "scaled_down"]
    assert kinds[0][1] == "1 → 2 replicas: 3 ongoing requests for 1 replicas (target 1 each)"
    assert AuditEntry.objects.filter(deployment=scaled, action="scale").count() == 4
    # Stopped and started again: from its initial count.
    assert deployer.stop(scaled.pk)
    deployer.restart(scaled.pk)
    assert (len(fresh(scaled).engine_urls), scaled.replica_count) == (1, 1)


@pytest.mark.usefixtures("engines")
def test_it_never_cuts_a_request_on_the_replica_it_removes(
    make_deployment: Callable[..., Deployment], site: Any
) -> None:
    site.MSHIP_DRAIN_GRACE_S = 0.1
    scaled = make_deployment("scaled", autoscaling_config=SCALING, config=SLOW)
    deployer.restart(scaled.pk)
    assert scaling.add_replica(scaled.pk, "by hand")
    leaving = fresh(scaled).engine_urls[-1]
    answers: list[str] = []
    auth = as_gateway.now()

    def long_request() -> None:
        answer = httpx.post(
            leaving + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            timeout=60,
            auth=auth,
        )
        answers.append(answer.json()["choices"][0]["message"]["content"])

    request = in_thread(long_request)
    wait_until(lambda: httpx.get(leaving + "/sim/stats").json()["running"] == 1, 10)
    assert scaling.remove_replica(scaled.pk, "by hand")  # returns once it stopped
    request.join(30)
    assert answers == [str(SLOW["reply"]).strip()] or answers == [SLOW["reply"]]
    assert (
        fresh(scaled).engine_urls == [scaled.engine_urls[0]] and leaving not in scaled.engine_urls
    )


@pytest.mark.usefixtures("engines")
def test_it_scales_up_only_within_the_memory_budget(
    make_deployment: Callable[..., Deployment], site: Any
) -> None:
    scaled = make_deployment("scaled", autoscaling_config=SCALING, config=SLOW, memory_gib=3.0)
    deployer.restart(scaled.pk)
    load = busy(fresh(scaled).engine_urls[0], 3)
    wait_until(lambda: running(scaled) == 3, 10)
    # 8 GiB: room for a second replica of 3 GiB, not a third.
    assert Autoscaler().tick() == ["scaled: one replica more"]
    refused = DeploymentEvent.objects.get(deployment=scaled, kind="scale_up_refused")
    assert "scaled needs" in refused.text and "short by" in refused.text
    assert fresh(scaled).replicas == 2 and fresh(scaled).state == State.READY
    for thread in load:
        thread.join(30)
