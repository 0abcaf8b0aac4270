"""One home for every operator action: the admin, /api and models.yaml change a deployment
the same way (deployments/operations.py), and refuse the same things with the same words."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from django_q.brokers import get_broker
from rest_framework.test import APIClient

from deployments import deployer, hooks, launch
from deployments.loaders import get_loader
from deployments.models import AuditEntry, Deployment, DeploymentEvent, State
from deployments.runtimes import RuntimeError_
from tests.conftest import reply_of, run_queue, sim, take_queue

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.postgres]

DOORS = ("admin", "api", "models_yaml")
# The fields of the admin's change form (its fieldsets, less what is read-only).
ADMIN_FIELDS = (
    "name",
    "aliases",
    "model",
    "loader",
    "usecase",
    "runtime",
    "image",
    "command",
    "config",
    "num_replicas",
    "memory_gib",
    "num_gpus",
    "mode",
    "idle_timeout_s",
    "evictable",
    "preload",
    "system",
    "responses",
)
JSON_FIELDS = ("aliases", "command", "config")


@pytest.fixture
def ops(transactional_db: None) -> User:
    get_broker().purge_queue()  # what other tests queued and no cluster ran
    return User.objects.create_superuser("ops", "o@example.com", "pw-123456")


def admin_form(deployment: Deployment, changes: dict[str, Any]) -> dict[str, str]:
    values = {field: getattr(deployment, field) for field in ADMIN_FIELDS} | changes
    form = {}
    for field, value in values.items():
        if field in JSON_FIELDS:
            form[field] = "" if value is None else json.dumps(value)
        elif isinstance(value, bool):
            if value:
                form[field] = "on"
        else:
            form[field] = "" if value is None else str(value)
    return form


def models_file(deployment: Deployment, changes: dict[str, Any], tmp_path: Path) -> Path:
    values = {field: getattr(deployment, field) for field in ADMIN_FIELDS} | changes
    config_key = get_loader(values["loader"]).config_key
    entry = {k: v for k, v in values.items() if v not in (None, [], {}) and k != "config"}
    entry[config_key] = values["config"]
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps({"models": [entry]}))))
    return path


def change(door: str, deployment: Deployment, user: User, tmp_path: Path, **changes: Any) -> Any:
    """Make `changes` to the deployment through one door; return that door's answer."""
    if door == "admin":
        client = Client()
        client.force_login(user)
        url = f"/admin/deployments/deployment/{deployment.pk}/change/"
        return client.post(url, admin_form(deployment, changes))
    if door == "api":
        api = APIClient()
        api.force_authenticate(user)
        return api.patch(f"/api/deployments/{deployment.pk}/", changes, format="json")
    call_command("deploy", "-f", str(models_file(deployment, changes, tmp_path)))
    return None


@pytest.mark.parametrize("door", DOORS)
def test_it_replaces_a_running_engine_with_the_sites_strategy_whichever_door_changed_it(
    door: str, ops: User, make_deployment: Any, site: Any, tmp_path: Path
) -> None:
    site.MSHIP_REPLACE_STRATEGY = "stop_start"
    deployment = make_deployment("edited", config=sim(reply="before"))
    deployment = deployer.restart(deployment.pk)
    assert reply_of(deployment.engine_url) == "before"

    answer = change(door, deployment, ops, tmp_path, config=sim(reply="after"))
    assert answer is None or answer.status_code in (200, 302)
    assert AuditEntry.objects.filter(deployment=deployment, action="update").count() == 1

    ran = run_queue()
    assert (
        "replace",
        (deployment.pk, "stop_start", "ops" if door != "models_yaml" else "cli:deploy"),
    ) in ran
    deployment.refresh_from_db()
    assert deployment.state == State.READY
    assert reply_of(deployment.engine_url) == "after"
    # stop_start, not blue_green: the old engine stopped before the new one started.
    kinds = list(
        DeploymentEvent.objects.filter(deployment=deployment)
        .order_by("time", "id")
        .values_list("kind", flat=True)
    )
    assert kinds[-4:] == ["stopping", "stopped", "starting", "ready"]


@pytest.mark.parametrize("door", DOORS)
def test_it_switches_the_mode_through_set_mode_whichever_door_changed_it(
    door: str, ops: User, make_deployment: Any, tmp_path: Path
) -> None:
    deployment = make_deployment("switched", config=sim(), mode="always_on", idle_timeout_s=600)
    answer = change(door, deployment, ops, tmp_path, mode="on_demand")
    assert answer is None or answer.status_code in (200, 302)

    deployment.refresh_from_db()
    assert deployment.mode == "on_demand"
    switch = AuditEntry.objects.get(deployment=deployment, action="ondemand_mode")
    assert switch.before == {"mode": "always_on"}
    assert switch.after == {"mode": "on_demand", "pending_mode": None}
    # The idle timer restarted at the switch, and the start backoff was forgiven.
    assert deployment.lease_until is not None
    expected = timezone.now() + timedelta(seconds=600)
    assert abs((deployment.lease_until - expected).total_seconds()) < 30
    assert deployment.failures_forgiven > 0  # read by every gateway process's controller
    # The mode is not also written as a plain update.
    assert not AuditEntry.objects.filter(deployment=deployment, action="update").exists()


def test_it_starts_a_stopped_deployment_switched_to_always_on_through_a_patch(
    ops: User, make_deployment: Any, tmp_path: Path
) -> None:
    deployment = make_deployment("lazy", config=sim(reply="up"), mode="on_demand")
    answer = change("api", deployment, ops, tmp_path, mode="always_on")
    assert answer.status_code == 200
    # It stays on demand until the start ends, so its name is served throughout.
    assert answer.json()["pending_mode"] == "always_on"
    assert [name for name, _ in run_queue()] == ["start"]
    deployment.refresh_from_db()
    assert (deployment.state, deployment.mode, deployment.pending_mode) == (
        State.READY,
        "always_on",
        None,
    )
    assert reply_of(deployment.engine_url) == "up"


def test_it_refuses_an_update_in_the_admin_as_in_the_api(
    ops: User, make_deployment: Any, site: Any, tmp_path: Path
) -> None:
    site.MSHIP_MEMORY_CAPACITY_GIB = 2
    deployment = make_deployment("big", config=sim(), mode="on_demand", memory_gib=4)
    expected = "big needs 4.0 GiB but 2.0 GiB of 2.0 GiB is free (short by 2.0 GiB)"

    answer = change("api", deployment, ops, tmp_path, mode="always_on")
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": expected,
        "code": "insufficient_memory",
        "shortfall_gib": 2.0,
        "need_gib": 4.0,
        "free_gib": 2.0,
        "capacity_gib": 2.0,
    }
    page = change("admin", deployment, ops, tmp_path, mode="always_on")
    assert page.status_code == 200  # the form again, with its error
    assert re.findall(r'errorlist nonfield"><li>(.*?)</li>', page.content.decode()) == [expected]

    deployment.refresh_from_db()
    assert (deployment.mode, deployment.pending_mode) == ("on_demand", None)
    assert not AuditEntry.objects.filter(deployment=deployment).exists()
    assert get_broker().queue_size() == 0


def test_it_refuses_fields_in_the_admin_as_in_the_api(
    ops: User, make_deployment: Any, tmp_path: Path
) -> None:
    deployment = make_deployment("both", config=sim())
    answer = change("api", deployment, ops, tmp_path, num_gpus=1)
    assert answer.status_code == 400
    assert answer.json() == {"memory_gib": ["give num_gpus or memory_gib, not both"]}
    page = change("admin", deployment, ops, tmp_path, num_gpus=1)
    assert page.status_code == 200
    errors = re.findall(
        r'errorlist[^"]*" id="id_memory_gib_error"><li>(.*?)</li>', page.content.decode()
    )
    assert errors == ["give num_gpus or memory_gib, not both"]
    deployment.refresh_from_db()
    assert deployment.num_gpus is None


def test_it_deletes_a_stopped_deployment_and_tells_litellm(ops: User, make_deployment: Any) -> None:
    deployment = make_deployment("gone", config=sim())
    told: list[bool] = []

    def tell() -> None:
        told.append(True)

    hooks.register(hooks.listing_changed, tell)
    try:
        api = APIClient()
        api.force_authenticate(ops)
        assert api.delete(f"/api/deployments/{deployment.pk}/").status_code == 204
    finally:
        hooks.listing_changed.remove(tell)
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert AuditEntry.objects.get(action="delete").object_repr == "gone"
    assert told == [True]


def test_it_stops_then_deletes_a_running_deployment(ops: User, make_deployment: Any) -> None:
    deployment = deployer.restart(make_deployment("running", config=sim()).pk)
    client = Client()
    client.force_login(ops)
    url = f"/admin/deployments/deployment/{deployment.pk}/delete/"
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert Deployment.objects.filter(pk=deployment.pk).exists()  # the engine stops first
    assert [name for name, _ in run_queue()] == ["remove"]
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert AuditEntry.objects.filter(action="delete", object_repr="running").exists()


def test_it_leaves_a_waiting_switch_alone_when_something_else_changes(
    ops: User, make_deployment: Any, tmp_path: Path
) -> None:
    deployment = make_deployment("waiting", config=sim(), mode="on_demand")
    assert change("api", deployment, ops, tmp_path, mode="always_on").status_code == 200
    answer = change("api", deployment, ops, tmp_path, idle_timeout_s=120)
    assert answer.status_code == 200
    assert (answer.json()["mode"], answer.json()["pending_mode"]) == ("on_demand", "always_on")
    assert AuditEntry.objects.filter(deployment=deployment, action="ondemand_mode").count() == 1
    assert AuditEntry.objects.filter(deployment=deployment, action="update").count() == 1


def test_it_drops_a_switch_whose_start_the_docker_engine_could_not_take(
    ops: User, make_deployment: Any, site: Any, tmp_path: Path
) -> None:
    site.MSHIP_DOCKER_HOST = f"unix://{tmp_path}/no-docker.sock"
    deployment = make_deployment(
        "boxed", runtime="docker", image="modelship:latest", config=sim(), mode="on_demand"
    )
    assert change("api", deployment, ops, tmp_path, mode="always_on").status_code == 200
    assert [name for name, _ in run_queue()] == ["start"]
    deployment.refresh_from_db()
    # Nothing ran: it is as it was, on demand, and its requests stop waiting for the switch.
    assert (deployment.state, deployment.mode, deployment.pending_mode) == (
        State.PLANNED,
        "on_demand",
        None,
    )
    assert "the Docker Engine is unreachable" in deployment.state_reason
    assert deployment.state_reason.endswith("(the switch to always on was not made)")


def test_it_leaves_a_deployment_as_it_was_when_its_switchs_launch_is_refused(
    ops: User, make_deployment: Any, tmp_path: Path
) -> None:
    """The seed: a refused start (the runtime would not launch the engine) clears the
    pending mode and leaves the deployment as it was, not failed."""
    deployment = make_deployment(
        "nobinary", command=["/nonexistent/engine", "--port", "{port}"], mode="on_demand"
    )
    assert change("api", deployment, ops, tmp_path, mode="always_on").status_code == 200
    run_queue()
    deployment.refresh_from_db()
    assert (deployment.state, deployment.mode, deployment.pending_mode) == (
        State.PLANNED,
        "on_demand",
        None,
    )
    assert deployment.state_reason.startswith("cannot run '/nonexistent/engine'")
    assert deployment.state_reason.endswith("(the switch to always on was not made)")
    # A start of its own (no switch) that the runtime refuses is failed, as before.
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.FAILED


def test_it_leaves_a_deployment_as_it_was_when_its_switchs_image_is_refused(
    ops: User, make_deployment: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(deployment: Any) -> None:
        raise RuntimeError_("pull access denied for modelship-nowhere")

    monkeypatch.setattr(launch, "fetch_image", refused)
    deployment = make_deployment("unpulled", config=sim(), mode="on_demand", state=State.STOPPED)
    assert change("api", deployment, ops, tmp_path, mode="always_on").status_code == 200
    run_queue()
    deployment.refresh_from_db()
    assert (deployment.state, deployment.mode, deployment.pending_mode) == (
        State.STOPPED,
        "on_demand",
        None,
    )
    assert deployment.state_reason == (
        "pull access denied for modelship-nowhere (the switch to always on was not made)"
    )


def queued_names() -> list[str]:
    """What is queued for the cluster, taken off the queue without running it."""
    return [task["func"].__name__ for task in take_queue()]


def test_it_asks_litellm_for_a_sync_on_a_state_change_a_removal_and_a_mode_change(
    ops: User, make_deployment: Any, site: Any, tmp_path: Path
) -> None:
    site.MSHIP_LITELLM_URL = "http://127.0.0.1:9"  # configured; the sync itself is not run
    deployment = make_deployment("listed", config=sim(), mode="on_demand")
    deployer.restart(deployment.pk)  # planned -> starting -> ready
    assert "sync_litellm" in queued_names()
    assert change("api", deployment, ops, tmp_path, mode="always_on").status_code == 200
    assert queued_names() == ["sync_litellm"]
    deployer.stop(deployment.pk)
    queued_names()
    api = APIClient()
    api.force_authenticate(ops)
    assert api.delete(f"/api/deployments/{deployment.pk}/").status_code == 204
    assert queued_names() == ["sync_litellm"]


@pytest.mark.parametrize("mode", ["on_demand", "sometimes"])
def test_it_refuses_a_mode_switch_through_every_door_and_changes_nothing(
    mode: str, ops: User, make_deployment: Any, tmp_path: Path
) -> None:
    """A system deployment is always on, and "sometimes" is no mode: each door says so."""
    system = make_deployment("decider", config=sim(), system=True)
    api = APIClient()
    api.force_authenticate(ops)
    answer = change("api", system, ops, tmp_path, mode=mode)
    assert answer.status_code == 400 and "mode" in answer.json()
    dedicated = api.patch(f"/api/deployments/{system.pk}/mode/", {"mode": mode}, format="json")
    if mode == "on_demand":
        assert dedicated.status_code == 409
        assert dedicated.json()["detail"] == "decider is a system deployment and is always on"
    else:
        assert dedicated.status_code == 400 and "mode" in dedicated.json()
    page = change("admin", system, ops, tmp_path, mode=mode)
    assert page.status_code == 200 and 'id="id_mode_error"' in page.content.decode()
    with pytest.raises(CommandError, match="nothing was changed"):
        change("models_yaml", system, ops, tmp_path, mode=mode)
    system.refresh_from_db()
    assert (system.mode, system.pending_mode) == (None, None)
    assert not AuditEntry.objects.filter(deployment=system).exists()
