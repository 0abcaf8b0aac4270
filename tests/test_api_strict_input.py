"""Every /api input is obeyed or refused, never ignored (issue 58): a field, a query
parameter or a models.yaml key the server does not know is a 400 naming it, with the name it
was probably meant to be; ids and page numbers of any length are a 4xx, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from deployments.models import Deployment
from openai_api.models import ApiKey
from openai_api.usage.models import Team

SIM = {"name": "sim", "model": "simulated", "loader": "simulated", "memory_gib": 1}
HUGE = "9" * 4400  # past int()'s 4,300 digits


@pytest.fixture
def api(transactional_db: None) -> APIClient:
    user = User.objects.create_superuser("ops", "ops@example.com", "secret-pass")
    client = APIClient()
    client.force_authenticate(user)
    return client


def refused(answer: Any, *fields: str) -> dict[str, Any]:
    assert answer.status_code == 400, answer.content
    body: dict[str, Any] = answer.json()
    assert set(fields) <= set(body), body
    return body


def test_it_refuses_a_mistyped_deployment_field_and_says_which_was_meant(api: APIClient) -> None:
    body = refused(
        api.post("/api/deployments/", {**SIM, "idel_timeout_s": 60}, format="json"),
        "idel_timeout_s",
    )
    assert "did you mean 'idle_timeout_s'" in body["idel_timeout_s"][0]
    body = refused(
        api.post(
            "/api/deployments/",
            {**SIM, "loader": "vllm", "vllm_engine_kwargs": {"max_model_len": 512}},
            format="json",
        ),
        "vllm_engine_kwargs",
    )
    assert "calls it 'config'" in body["vllm_engine_kwargs"][0]
    assert not Deployment.objects.exists()
    made = api.post("/api/deployments/", {**SIM, "idle_timeout_s": 60}, format="json")
    assert made.status_code == 201 and made.json()["idle_timeout_s"] == 60
    # What a client read it may send back whole: read-only fields are known, not refused.
    shown = api.get(f"/api/deployments/{made.json()['id']}/").json()
    back = api.put(f"/api/deployments/{shown['id']}/", {**shown, "memory_gib": 2}, format="json")
    assert back.status_code == 200, back.content
    patched = api.patch(f"/api/deployments/{shown['id']}/", {"max_concurency": 2}, format="json")
    assert (
        "did you mean 'max_concurrency'" in refused(patched, "max_concurency")["max_concurency"][0]
    )
    assert Deployment.objects.get().max_concurrency is None


def test_it_names_every_unknown_field_beside_the_other_errors(api: APIClient) -> None:
    answer = api.post(
        "/api/deployments/", {**SIM, "memory_gib": "lots", "colour": "red"}, format="json"
    )
    body = refused(answer, "memory_gib", "colour")
    assert body["colour"] == ["Unknown field 'colour'."]  # nothing close to suggest


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/keys/", {"name": "k", "requests_per_minut": 5}),
        ("post", "/api/teams/", {"name": "t", "token_per_day": 5}),
        ("post", "/api/apply", {"file": "models: []\n", "reconclie": True}),
        ("post", "/api/stored-models/", {"source": "hf:org/x", "inclde": ["*.gguf"]}),
        ("patch", "/api/deployments/{id}/mode/", {"mode": "on_demand", "now": True}),
    ],
)
def test_it_refuses_unknown_fields_on_each_write(
    api: APIClient, method: str, path: str, body: dict[str, Any]
) -> None:
    deployment = Deployment.objects.create(**SIM)
    before = (ApiKey.objects.count(), Team.objects.count(), deployment.mode)
    answer = getattr(api, method)(path.format(id=deployment.pk), body, format="json")
    odd = [name for name in body if name not in {"name", "file", "source", "mode"}]
    refused(answer, *odd)
    deployment.refresh_from_db()
    assert (ApiKey.objects.count(), Team.objects.count(), deployment.mode) == before


@pytest.mark.parametrize(
    ("path", "parameter", "meant"),
    [
        ("/api/keys/?revokd=true", "revokd", "revoked"),
        ("/api/deployments/?stat=running", "stat", "state"),
        ("/api/events/?limt=5", "limt", "limit"),
        ("/api/usage/?snce=24h", "snce", "since"),
        ("/api/deployments/{id}/logs/?tial=5", "tial", "tail"),
    ],
)
def test_it_refuses_an_unknown_query_parameter(
    api: APIClient, path: str, parameter: str, meant: str
) -> None:
    deployment = Deployment.objects.create(**SIM)
    answer = api.get(path.format(id=deployment.pk))
    said = refused(answer, parameter)[parameter][0]
    assert f"did you mean {meant!r}" in said, said


def test_it_still_takes_the_format_parameter(api: APIClient) -> None:
    assert api.get("/api/keys/?format=json&revoked=false").status_code == 200
    assert api.get("/api/usage/?format=json").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        f"/api/deployments/{HUGE}/",
        f"/api/deployments/{HUGE}/start/",
        f"/api/keys/{HUGE}/",
        f"/api/teams/{HUGE}/",
        f"/api/audit/{HUGE}/",
        f"/api/events/{HUGE}/",
        f"/api/stored-models/{HUGE}/",
        f"/api/deployments/?limit={HUGE}",
        f"/api/events/?offset={HUGE}",
        f"/api/keys/?team={HUGE}",
        f"/api/audit/?deployment={HUGE}",
    ],
)
def test_it_answers_an_id_of_4400_digits_with_a_4xx(api: APIClient, path: str) -> None:
    answer = api.post(path) if path.endswith("start/") else api.get(path)
    assert answer.status_code in (400, 404) or (
        answer.status_code == 200 and answer.json()["results"] == []
    ), (path, answer.status_code, answer.content[:200])


def test_it_finds_no_team_of_4400_digits(api: APIClient) -> None:
    answer = api.post("/api/keys/", {"name": "k", "team": HUGE}, format="json")
    assert "No team" in refused(answer, "team")["team"][0]


def test_it_pages_a_huge_limit_as_the_largest_page(api: APIClient) -> None:
    Deployment.objects.create(**SIM)
    answer = api.get(f"/api/deployments/?limit={HUGE}&offset=0")
    assert answer.status_code == 200 and answer.json()["count"] == 1
    assert len(answer.json()["results"]) == 1
