"""schemathesis against /api/, from the API's own OpenAPI schema, with a superuser's token:
no 5xx, and every answer matches the schema (status codes, shapes, content types)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from deployments.api.tokens import issue_token
from deployments.models import Deployment

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
