"""schemathesis against /api/, from the API's own OpenAPI schema, with a superuser's token:
no 5xx, and every answer matches the schema (status codes, shapes, content types). Beyond
the schema: every {id} route with ids that are not ids, and every body with JSON nested
far too deep, always answered in JSON, never a 5xx."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
import schemathesis.specs.openapi.schemas  # (see below)
from django.contrib.auth.models import User
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import positive_data_acceptance

from deployments.api.tokens import issue_token
from deployments.models import Deployment
from openai_api.models import ApiKey
from openai_api.usage.models import Team

# schemathesis imports its OpenAPI modules on first use; imported here, at collection, they are
# not parsed (pytest's assertion rewrite) while the in-process gateway's threads run, where
# CPython 3.11 can fail with "AST constructor recursion depth mismatch" (gh-106905).

EXAMPLES = int(os.environ.get("MSHIP_FUZZ_API_EXAMPLES", "25"))


@pytest.fixture
def api_schema() -> Any:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    return schemathesis.openapi.from_dict(raw)


@pytest.fixture
def token(transactional_db: None) -> str:
    user = User.objects.create_superuser("fuzz", "f@example.com", "pw-123456")
    for name in ("a", "b", "c"):  # so that some generated ids name a real deployment
        Deployment.objects.create(name=name, model="simulated", loader="simulated")
    return issue_token(user)


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("MSHIP_FUZZ_SEED") != "random",
    suppress_health_check=list(HealthCheck),
    database=None,
)


def test_it_answers_every_api_operation_as_its_schema_says(
    api_schema: Any, token: str, live_server: Any
) -> None:
    headers = {"Authorization": f"Token {token}"}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15
    failed: list[str] = []
    for operation in operations:

        @FUZZ
        @given(case=operation.as_strategy())
        def answers_as_documented(case: Any) -> None:
            response = case.call(base_url=live_server.url, headers=headers)
            # A schema cannot say every rule that spans fields (a loader's use cases, names
            # that clash): a 400 with field errors for such input is right, not a lie.
            case.validate_response(response, excluded_checks=[positive_data_acceptance])

        try:
            answers_as_documented()
        except (Exception, BaseExceptionGroup) as exc:  # every operation is tried, all reported
            failed.append(f"{operation.label}: {exc}")
    assert not failed, "\n\n".join(failed)


# Path segments an id must not be: numbers the router does not take, text, Unicode digits,
# dots and encoded slashes that no route matches.
NOT_AN_ID = st.one_of(
    st.sampled_from(["1.5", "-1", "0x1", "1e3", "\u00b2", "a/b", "..", "\x00", "1 ", "\u0663"]),
    st.text(min_size=1, max_size=20).filter(lambda s: s not in (".", "..") and not s.isdecimal()),
)


def id_routes(raw: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (method.upper(), path)
        for path, operations in raw["paths"].items()
        if "{id}" in path
        for method in operations
    ]


def deep(depth: int) -> bytes:
    return b'{"name": ' + b"[" * depth + b"]" * depth + b"}"


def test_it_answers_every_id_route_in_json_whatever_the_id(token: str, live_server: Any) -> None:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    routes = id_routes(raw)
    assert len(routes) >= 12
    headers = {"Authorization": f"Token {token}"}
    with httpx.Client(base_url=live_server.url, headers=headers) as client:

        @FUZZ
        @given(route=st.sampled_from(routes), id_=NOT_AN_ID)
        def answers_json(route: tuple[str, str], id_: str) -> None:
            method, path = route
            answer = client.request(method, path.replace("{id}", quote(id_, safe="")))
            assert answer.status_code < 500, (method, path, id_, answer.text[:200])
            assert answer.headers["content-type"].startswith("application/json"), (
                method,
                path,
                id_,
                answer.text[:200],
            )

        answers_json()


def real_ids() -> dict[str, int]:
    """An object of each kind an {id} route names, by its route's collection."""
    return {
        "deployments": Deployment.objects.get(name="a").pk,
        "keys": ApiKey.issue("k")[0].pk,
        "teams": Team.objects.create(name="t").pk,
    }


def with_id(path: str, ids: dict[str, int]) -> str:
    return path.replace("{id}", str(ids.get(path.split("/")[2], 0)))


def test_it_answers_deep_json_on_every_operation_with_a_body_in_json(
    token: str, live_server: Any
) -> None:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    ids = real_ids()
    operations = [
        (method.upper(), with_id(path, ids))
        for path, methods in raw["paths"].items()
        for method, operation in methods.items()
        if "requestBody" in operation
    ]
    assert len(operations) >= 6
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=live_server.url, headers=headers) as client:
        for method, path in operations:
            for depth in (65, 1_000, 10_000, 100_000):
                answer = client.request(method, path, content=deep(depth))
                assert answer.status_code == 400, (method, path, depth, answer.text[:200])
                assert "nests deeper" in answer.json()["detail"]


# Field names no operation knows: hypothesis's, kept apart from every real one.
UNKNOWN_NAMES = st.from_regex(r"[a-z][a-z_]{0,24}", fullmatch=True)


def body_fields(raw: dict[str, Any], operation: dict[str, Any]) -> set[str]:
    """Every property the operation's JSON body schema names (its $ref followed)."""
    content = operation["requestBody"]["content"]
    schema = next(iter(content.values()))["schema"]
    if "$ref" in schema:
        schema = raw["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return set(schema.get("properties", {}))


def test_it_refuses_an_unknown_field_on_every_operation_with_a_body(
    token: str, live_server: Any
) -> None:
    """Strict input (issue 58): a field `/api` does not know is a 400 naming it, never
    dropped; nothing is created or changed by the request."""
    raw = SchemaGenerator().get_schema(request=None, public=True)
    ids = real_ids()
    operations = [
        (method.upper(), with_id(path, ids), known)
        for path, methods in raw["paths"].items()
        for method, operation in methods.items()
        if "requestBody" in operation and (known := body_fields(raw, operation))
    ]
    assert len(operations) >= 6
    headers = {"Authorization": f"Token {token}"}
    before = (Deployment.objects.count(), ApiKey.objects.count(), Team.objects.count())
    with httpx.Client(base_url=live_server.url, headers=headers) as client:

        @FUZZ
        @given(operation=st.sampled_from(operations), name=UNKNOWN_NAMES)
        def refused(operation: tuple[str, str, set[str]], name: str) -> None:
            method, path, known = operation
            if name in known or name in ("csrfmiddlewaretoken", "format"):
                return
            answer = client.request(method, path, json={name: 1})
            assert answer.status_code == 400, (method, path, name, answer.text[:200])
            assert name in answer.json(), (method, path, name, answer.text[:200])

        refused()
    assert (Deployment.objects.count(), ApiKey.objects.count(), Team.objects.count()) == before


def test_it_refuses_an_unknown_query_parameter_on_every_list(token: str, live_server: Any) -> None:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    lists = [
        (path, {p["name"] for p in operation.get("parameters", [])})
        for path, methods in raw["paths"].items()
        for method, operation in methods.items()
        if method == "get"
        and "{id}" not in path
        and any(p["name"] == "limit" for p in operation.get("parameters", []))
    ]
    assert len(lists) >= 5
    headers = {"Authorization": f"Token {token}"}
    with httpx.Client(base_url=live_server.url, headers=headers) as client:

        @FUZZ
        @given(listed=st.sampled_from(lists), name=UNKNOWN_NAMES)
        def refused(listed: tuple[str, set[str]], name: str) -> None:
            path, known = listed
            if name in known or name == "format":
                return
            answer = client.get(path, params={name: "1"})
            assert answer.status_code == 400, (path, name, answer.text[:200])
            assert name in answer.json(), (path, name, answer.text[:200])

        refused()
