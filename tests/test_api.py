"""The REST API: CRUD with field errors, operations answering 202, the host, audit, events."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django_q.brokers import get_broker
from rest_framework.test import APIClient

from deployments import deployer
from deployments.api.tokens import issue_token
from deployments.models import AuditEntry, Deployment, State

SIM = {"name": "sim", "model": "simulated", "loader": "simulated", "memory_gib": 1}


@pytest.fixture
def api(transactional_db: None) -> APIClient:
    user = User.objects.create_superuser("ops", "ops@example.com", "secret-pass")
    client = APIClient()
    client.force_authenticate(user)
    client.user = user  # type: ignore[attr-defined]
    return client


def queued() -> int:
    return int(get_broker().queue_size() or 0)


def test_it_refuses_anonymous_and_non_staff_callers(transactional_db: None) -> None:
    client = APIClient()
    assert client.get("/api/deployments/").status_code == 401
    user = User.objects.create_user("viewer", password="pw-123456")
    client.force_authenticate(user)
    assert client.get("/api/deployments/").status_code == 403


def test_it_accepts_a_token(transactional_db: None) -> None:
    user = User.objects.create_superuser("tok", "t@example.com", "pw-123456")
    token = issue_token(user)
    client = APIClient()
    answer = client.get("/api/deployments/", HTTP_AUTHORIZATION=f"Token {token}")
    assert answer.status_code == 200


@pytest.mark.sample("rest")
def test_it_creates_reads_updates_and_deletes_with_audit(api: APIClient) -> None:
    created = api.post("/api/deployments/", {**SIM, "aliases": ["s"]}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["state"] == "planned"
    assert body["effective_mode"] == "always_on"
    assert body["need_gib"] == 1.0
    pk = body["id"]

    patched = api.patch(f"/api/deployments/{pk}/", {"memory_gib": 2}, format="json")
    assert patched.status_code == 200
    assert patched.json()["need_gib"] == 2.0 and patched.json()["evictable"] is True
    listed = api.get("/api/deployments/?loader=simulated").json()
    assert [d["name"] for d in listed["results"]] == ["sim"]

    assert api.delete(f"/api/deployments/{pk}/").status_code == 204
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "actor"))
    assert actions == [("create", "ops"), ("update", "ops"), ("delete", "ops")]
    update = AuditEntry.objects.get(action="update")
    assert ((update.before or {})["memory_gib"], (update.after or {})["memory_gib"]) == (1.0, 2.0)
    assert update.request_id  # every request carries one


@pytest.mark.sample("rest")
def test_it_answers_bad_input_with_field_errors(api: APIClient) -> None:
    api.post("/api/deployments/", SIM, format="json")
    answer = api.post(
        "/api/deployments/",
        {
            "name": "sim",
            "model": "m",
            "loader": "simulated",
            "usecase": "image",
            "idle_timeout_s": 10,
            "memory_gib": 1,
            "num_gpus": 1,
            "config": {"bogus": 1},
        },
        format="json",
    )
    assert answer.status_code == 400
    errors = answer.json()
    assert "already exists" in errors["name"][0]
    assert "greater than or equal to 60" in errors["idle_timeout_s"][0]
    assert Deployment.objects.count() == 1


def test_it_reports_cross_field_problems(api: APIClient) -> None:
    answer = api.post(
        "/api/deployments/",
        {**SIM, "usecase": "image", "num_gpus": 1, "config": {"bogus": 1}},
        format="json",
    )
    assert answer.status_code == 400
    errors = answer.json()
    assert errors["usecase"] == [
        "usecase 'image' is not served by simulated (embed, generate, transcription, translation)"
    ]
    assert errors["memory_gib"] == ["give num_gpus or memory_gib, not both"]
    assert errors["config"] == ["simulated_config: unknown key 'bogus'"]
    llama = {**SIM, "loader": "llama_server", "model": "/m.gguf", "responses": "engine"}
    refused = api.post("/api/deployments/", llama, format="json")
    assert refused.json()["responses"] == [
        "the llama_server engine has no /v1/responses of its own"
    ]


def test_it_refuses_an_alias_another_deployment_serves(api: APIClient) -> None:
    api.post("/api/deployments/", SIM, format="json")
    answer = api.post(
        "/api/deployments/", {**SIM, "name": "other", "aliases": ["sim"]}, format="json"
    )
    assert answer.status_code == 400
    assert answer.json()["aliases"] == ["'sim' is served by both 'sim' and 'other'"]


@pytest.mark.sample("rest")
def test_it_queues_a_start_and_answers_202(api: APIClient) -> None:
    pk = api.post("/api/deployments/", SIM, format="json").json()["id"]
    before = queued()
    answer = api.post(f"/api/deployments/{pk}/start/")
    assert answer.status_code == 202
    assert answer.json() == {"id": pk, "name": "sim", "status": "queued"}
    assert queued() == before + 1
    assert AuditEntry.objects.filter(action="start", deployment_id=pk).count() == 1


def test_it_answers_409_with_the_shortfall_when_a_start_does_not_fit(
    api: APIClient, engines: None
) -> None:
    hog = Deployment.objects.create(**{**SIM, "name": "hog", "memory_gib": 7.5})
    deployer.restart(hog.pk)
    pk = api.post("/api/deployments/", {**SIM, "memory_gib": 2}, format="json").json()["id"]
    answer = api.post(f"/api/deployments/{pk}/start/")
    assert answer.status_code == 409
    body = answer.json()
    assert body["code"] == "insufficient_memory"
    assert body["shortfall_gib"] == 1.5
    assert body["need_gib"] == 2.0
    assert "short by 1.5 GiB" in body["detail"]


def test_it_refuses_sleep_and_wake_in_the_wrong_state(api: APIClient) -> None:
    pk = api.post("/api/deployments/", SIM, format="json").json()["id"]
    asleep = api.post(f"/api/deployments/{pk}/wake/")
    assert asleep.status_code == 409
    assert asleep.json()["code"] == "invalid_state"
    llama = api.post(
        "/api/deployments/",
        {**SIM, "name": "llama", "loader": "llama_server", "model": "/m.gguf"},
        format="json",
    ).json()["id"]
    refused = api.post(f"/api/deployments/{llama}/sleep/")
    assert refused.status_code == 409
    assert refused.json()["code"] == "cannot_sleep"


def test_it_stops_a_running_deployment(api: APIClient, engines: None) -> None:
    deployment = Deployment.objects.create(**SIM)
    deployer.restart(deployment.pk)
    answer = api.post(f"/api/deployments/{deployment.pk}/stop/")
    assert answer.status_code == 202
    assert (
        api.post(
            f"/api/deployments/{Deployment.objects.create(**{**SIM, 'name': 'idle'}).pk}/stop/"
        ).status_code
        == 200
    )


def test_it_switches_mode_audited_as_ondemand_mode(api: APIClient, engines: None) -> None:
    deployment = Deployment.objects.create(**SIM)
    deployer.restart(deployment.pk)
    answer = api.patch(
        f"/api/deployments/{deployment.pk}/mode/", {"mode": "on_demand"}, format="json"
    )
    assert answer.status_code == 200
    assert answer.json()["effective_mode"] == "on_demand"
    assert answer.json()["when_idle"] == "stop, started again by the next request"
    entry = AuditEntry.objects.get(action="ondemand_mode")
    assert entry.before == {"mode": "always_on"}
    assert entry.after == {"mode": "on_demand", "pending_mode": None}
    assert entry.actor == "ops"
    bad = api.patch(f"/api/deployments/{deployment.pk}/mode/", {"mode": "sometimes"}, format="json")
    assert bad.status_code == 400
    assert "mode" in bad.json()
    pinned = Deployment.objects.create(**{**SIM, "name": "pinned"})
    assert api.get(f"/api/deployments/{pinned.pk}/").json()["when_idle"] is None  # always on


def test_it_starts_a_stopped_on_demand_deployment_switched_to_always_on(
    api: APIClient,
) -> None:
    deployment = Deployment.objects.create(**SIM, mode="on_demand")
    answer = api.patch(
        f"/api/deployments/{deployment.pk}/mode/", {"mode": "always_on"}, format="json"
    )
    body = answer.json()
    # It stays on demand until the start it waits for ends.
    assert (body["effective_mode"], body["pending_mode"]) == ("on_demand", "always_on")
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    try:
        assert deployment.state == State.READY
        assert (deployment.mode, deployment.pending_mode) == ("always_on", None)
    finally:
        deployer.stop(deployment.pk)


def test_it_refuses_on_demand_for_a_system_deployment(api: APIClient) -> None:
    deployment = Deployment.objects.create(**SIM, system=True)
    answer = api.patch(
        f"/api/deployments/{deployment.pk}/mode/", {"mode": "on_demand"}, format="json"
    )
    assert answer.status_code == 409
    assert answer.json()["code"] == "invalid_state"


def test_it_shows_the_host_budget(api: APIClient) -> None:
    body = api.get("/api/host").json()
    assert body["capacity_gib"] == 8.0
    assert body["free_gib"] == 8.0


@pytest.mark.sample("rest")
def test_it_filters_audit_entries_and_events(api: APIClient, engines: None) -> None:
    deployment = Deployment.objects.create(**SIM)
    deployer.restart(deployment.pk)
    api.patch(f"/api/deployments/{deployment.pk}/", {"memory_gib": 1.5}, format="json")
    audit = api.get("/api/audit/?action=update").json()["results"]
    assert [a["object_repr"] for a in audit] == ["sim"]
    events = api.get(f"/api/events/?deployment={deployment.pk}&kind=ready").json()["results"]
    assert len(events) == 1
    assert events[0]["deployment_name"] == "sim"


def test_it_serves_the_openapi_schema(api: APIClient) -> None:
    answer = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert answer.status_code == 200
    paths = answer.json()["paths"]
    assert "/api/deployments/{id}/start/" in paths
    assert "/api/deployments/{id}/mode/" in paths


@pytest.mark.postgres
def test_it_takes_any_iso_time_in_filters_and_refuses_what_is_not_an_id(api: APIClient) -> None:
    # PostgreSQL takes offsets up to ±15:59 only: times are compared in UTC.
    for query in ("since=4817-03-29T15:09:10.677-23:39", "until=0001-01-01T00:00:00%2B00:00"):
        assert api.get(f"/api/events/?{query}").status_code == 200, query
        assert api.get(f"/api/audit/?{query}").status_code == 200, query
    assert api.get("/api/events/?since=0001-01-01T00:00:00%2B23:00").status_code == 400
    assert api.get("/api/audit/?deployment=999999").json()["results"] == []
    for bad in ("deployment=1.5", "deployment=-1e300", "user=x"):
        assert api.get(f"/api/audit/?{bad}").status_code == 400, bad
    assert api.get("/api/deployments/?system=AAA").status_code == 400


@pytest.mark.postgres
def test_it_pages_within_what_the_database_takes(api: APIClient) -> None:
    api.post("/api/deployments/", SIM, format="json")
    for query in ("limit=3255031453454229307392", "offset=99999999999999999999999"):
        answer = api.get(f"/api/deployments/?{query}")
        assert answer.status_code == 200, query
    assert api.get("/api/deployments/?limit=0").status_code == 400  # the schema's minimum is 1
    assert len(api.get("/api/deployments/?limit=5000").json()["results"]) == 1


def test_it_pins_a_deployment_so_that_make_room_never_stops_it(api: APIClient) -> None:
    made = api.post("/api/deployments/", {**SIM, "mode": "on_demand"}, format="json").json()
    pinned = api.patch(f"/api/deployments/{made['id']}/", {"evictable": False}, format="json")
    assert pinned.status_code == 200 and pinned.json()["evictable"] is False
    update = AuditEntry.objects.get(action="update")
    assert ((update.before or {})["evictable"], (update.after or {})["evictable"]) == (True, False)
    refused = api.patch(f"/api/deployments/{made['id']}/", {"evictable": "never"}, format="json")
    assert refused.status_code == 400 and "evictable" in refused.json()


def test_it_takes_a_priority_and_a_concurrency_limit_and_refuses_bad_ones(api: APIClient) -> None:
    made = api.post("/api/deployments/", {**SIM, "mode": "on_demand"}, format="json").json()
    assert made["priority"] == 0 and made["start_s"] is None  # normal; never started
    url = f"/api/deployments/{made['id']}/"
    assert api.patch(url, {"priority": "high"}, format="json").json()["priority"] == 10
    assert api.patch(url, {"priority": -42}, format="json").json()["priority"] == -42
    for bad in ("urgent", 101, True, 2.5):
        refused = api.patch(url, {"priority": bad}, format="json")
        assert refused.status_code == 400 and "priority" in refused.json(), bad
    assert Deployment.objects.get(pk=made["id"]).priority == -42
    assert made["max_concurrency"] is None  # no limit
    assert api.patch(url, {"max_concurrency": 4}, format="json").json()["max_concurrency"] == 4
    for bad in (0, -1, "many", True):
        refused = api.patch(url, {"max_concurrency": bad}, format="json")
        assert refused.status_code == 400 and "max_concurrency" in refused.json(), bad
