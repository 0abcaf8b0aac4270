"""/api answers what it cannot take in JSON, with a 4xx, as its schema says: deep JSON,
paths no route matches, values the schema refuses, and an action on a deployment removed
while the action was on its way (issue 35, item 5)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.urls import get_resolver
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from deployments.api.views import DeploymentViewSet
from deployments.models import AuditEntry, Deployment

if TYPE_CHECKING:
    from django.http import HttpResponse

SIM = {"name": "sim", "model": "simulated", "loader": "simulated", "memory_gib": 1}


@pytest.fixture
def api(transactional_db: None) -> APIClient:
    user = User.objects.create_superuser("ops", "ops@example.com", "secret-pass")
    client = APIClient()
    client.force_authenticate(user)
    return client


def json_of(answer: HttpResponse) -> Any:
    assert answer["Content-Type"].startswith("application/json"), answer.content[:200]
    return answer.json()  # type: ignore[attr-defined]


def test_it_answers_json_nested_10000_deep_with_a_400(api: APIClient) -> None:
    deep = "[" * 10_000 + "]" * 10_000
    for path in ("/api/deployments/", "/api/keys/", "/api/apply"):
        answer = api.generic("POST", path, deep, content_type="application/json")
        assert answer.status_code == 400, path
        assert "nests deeper than 64" in json_of(answer)["detail"]
    # Deep enough to pass the decoder, too deep for the API: refused the same.
    middling = '{"name": "x", "config": ' + "[" * 500 + "]" * 500 + "}"
    answer = api.generic("POST", "/api/deployments/", middling, content_type="application/json")
    assert answer.status_code == 400
    assert not Deployment.objects.exists()


def test_it_takes_json_64_levels_deep_and_refuses_65(api: APIClient) -> None:
    def body(depth: int) -> str:  # an object of depth `depth`, an unknown field nested in it
        return '{"name": "k", "extra": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"

    # 64 deep is read, and its unknown field named; 65 is not read at all.
    answer = api.generic("POST", "/api/keys/", body(64), content_type="application/json")
    assert answer.status_code == 400 and set(answer.json()) == {"extra"}, answer.content
    answer = api.generic("POST", "/api/keys/", body(65), content_type="application/json")
    assert answer.status_code == 400 and "nests deeper than 64" in answer.json()["detail"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/deployments/1.5/",
        "/api/deployments/1.5/start/",
        "/api/deployments/abc/logs/",
        "/api/deployments/a%2Fb/",
        "/api/deployments/%C2%B2/",
        "/api/keys/1.0/revoke/",
        "/api/audit/x.y/",
        "/api/events/-/",
        "/api/deployments/1/no-such-action/",
        "/api/nothing-here",
    ],
)
def test_it_answers_a_path_no_route_matches_with_a_json_404(api: APIClient, path: str) -> None:
    assert api.get(path).status_code == 404
    for method in ("GET", "POST", "PATCH", "DELETE"):
        answer = api.generic(method, path)
        assert answer.status_code in (404, 405), (method, path)  # 405: a GET-only action
        assert json_of(answer)["detail"], (method, path)


def test_it_keeps_html_404_pages_outside_the_api(api: APIClient) -> None:
    answer = api.get("/admin/no-such-page/")
    assert answer.status_code in (302, 404)
    answer = api.get("/no-such-page")
    assert answer.status_code == 404
    assert answer["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/keys/?revoked=null", "revoked"),
        ("/api/keys/?revoked=", "revoked"),
        ("/api/deployments/?system=", "system"),
        ("/api/events/?since=", "since"),
        ("/api/audit/?until=", "until"),
        ("/api/audit/?deployment=", "deployment"),
        ("/api/audit/?deployment=0", "deployment"),
        ("/api/events/?limit=null", "limit"),
        ("/api/events/?limit=0", "limit"),
        ("/api/deployments/?limit=", "limit"),
        ("/api/keys/?offset=-1", "offset"),
        ("/api/audit/?limit=%C2%B2", "limit"),
    ],
)
def test_it_refuses_query_values_the_schema_refuses(api: APIClient, path: str, field: str) -> None:
    answer = api.get(path)
    assert answer.status_code == 400, (path, answer.content)
    assert field in json_of(answer), path


def test_it_still_pages_and_filters_with_good_values(api: APIClient) -> None:
    assert api.get("/api/events/?limit=5&offset=0").status_code == 200
    assert api.get("/api/events/?limit=100000").json()["results"] == []  # capped, not refused
    assert api.get("/api/keys/?revoked=false").status_code == 200
    assert api.get("/api/events/?since=2026-01-01T00:00:00Z").status_code == 200


def test_it_refuses_true_and_false_for_numbers(api: APIClient) -> None:
    answer = api.post("/api/deployments/", {**SIM, "num_gpus": False}, format="json")
    assert answer.status_code == 400
    assert "num_gpus" in answer.json()
    answer = api.post("/api/deployments/", {**SIM, "num_replicas": True}, format="json")
    assert "num_replicas" in answer.json()
    answer = api.post("/api/keys/", {"name": "k", "requests_per_minute": True}, format="json")
    assert answer.status_code == 400
    assert "requests_per_minute" in answer.json()
    assert not Deployment.objects.exists()


def test_it_refuses_a_form_object_for_a_list_of_model_names(api: APIClient) -> None:
    answer = api.post("/api/keys/", {"name": "k", "allowed_models": "{}"}, format="multipart")
    assert answer.status_code == 400
    assert "allowed_models" in answer.json()
    answer = api.post("/api/keys/", {"name": "k", "allowed_models": ["sim", "a/b"]})
    assert answer.status_code == 201, answer.json()
    assert answer.json()["allowed_models"] == ["sim", "a/b"]


def test_it_states_the_limits_it_enforces_in_its_schema() -> None:
    schema = SchemaGenerator().get_schema(request=None, public=True)

    def parameter(path: str, name: str) -> dict[str, Any]:
        found = [p for p in schema["paths"][path]["get"]["parameters"] if p["name"] == name]
        return dict(found[0]["schema"])

    assert parameter("/api/audit/", "deployment")["minimum"] == 1
    assert parameter("/api/events/", "deployment")["minimum"] == 1
    assert parameter("/api/deployments/{id}/logs/", "tail")["minimum"] == 1
    assert parameter("/api/deployments/{id}/logs/", "tail")["maximum"] == 10_000
    assert parameter("/api/deployments/{id}/logs/", "replica")["maximum"] == 1000
    assert parameter("/api/deployments/{id}/metrics/", "replica")["maximum"] == 1000
    assert parameter("/api/keys/", "limit")["minimum"] == 1
    assert parameter("/api/keys/", "offset")["minimum"] == 0
    components = schema["components"]["schemas"]
    assert components["ApiKey"]["properties"]["name"]["minLength"] == 1
    assert "unique" in components["Deployment"]["properties"]["name"]["description"]
    item = components["ApiKey"]["properties"]["allowed_models"]["items"]
    assert item["pattern"].startswith("^[A-Za-z0-9]")


def test_it_refuses_a_replica_over_the_limit_its_schema_states(api: APIClient) -> None:
    pk = api.post("/api/deployments/", SIM, format="json").json()["id"]
    answer = api.get(f"/api/deployments/{pk}/logs/?replica=1001")
    assert answer.status_code == 400
    assert "replica" in answer.json()


def removed_after_the_views_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DELETE that lands between the view's read and the operation: the view's own
    get_object, then the row removed, as another request's DELETE does."""
    read = DeploymentViewSet.get_object

    def read_then_removed(self: DeploymentViewSet) -> Deployment:
        deployment = read(self)
        Deployment.objects.filter(pk=deployment.pk).delete()
        return deployment

    monkeypatch.setattr(DeploymentViewSet, "get_object", read_then_removed)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", "mode/", {"mode": "on_demand"}),
        ("PATCH", "", {"memory_gib": 2}),
        ("PATCH", "", {"mode": "on_demand"}),
        ("PUT", "", {**SIM, "memory_gib": 2}),
        ("POST", "start/", None),
    ],
)
def test_it_answers_404_to_an_action_racing_a_delete(
    api: APIClient,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    pk = api.post("/api/deployments/", SIM, format="json").json()["id"]
    removed_after_the_views_read(monkeypatch)
    answer = api.generic(
        method, f"/api/deployments/{pk}/{path}", json.dumps(body or {}), "application/json"
    )
    assert answer.status_code == 404
    assert json_of(answer)["code"] == "not_found"
    assert list(AuditEntry.objects.values_list("action", flat=True)) == ["create"]


def test_it_answers_an_error_outside_the_views_in_json_under_api_only() -> None:
    handler = get_resolver().resolve_error_handler(500)
    answer = handler(RequestFactory().get("/api/deployments/"))
    assert answer.status_code == 500
    assert answer["Content-Type"] == "application/json"
    assert json.loads(answer.content) == {
        "detail": "Internal server error.",
        "code": "server_error",
    }
    page = handler(RequestFactory().get("/admin/"))
    assert page.status_code == 500
    assert page["Content-Type"].startswith("text/html")
