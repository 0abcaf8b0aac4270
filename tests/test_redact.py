"""Secrets never reach an audit row or an engine's log line."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from common.redact import MASK, redact, redact_argv, redact_urls
from deployments.models import AuditEntry


@pytest.mark.parametrize(
    ("value", "masked"),
    [
        ({"hf_token": "hf_abc", "max_tokens": 5}, {"hf_token": MASK, "max_tokens": 5}),
        (
            {"environment": {"HF_HOME": "/x", "A": "b"}},
            {"environment": {"HF_HOME": MASK, "A": MASK}},
        ),
        ({"environment": ["A=b"]}, {"environment": [f"A={MASK}"]}),
        ({"headers": {"Authorization": "Bearer x"}}, {"headers": {"Authorization": MASK}}),
        ({"api_key": ""}, {"api_key": ""}),
        ({"nested": [{"password": "p"}]}, {"nested": [{"password": MASK}]}),
    ],
)
def test_it_masks_values_named_like_secrets(value: object, masked: object) -> None:
    assert redact(value) == masked


def test_it_masks_secret_flags_on_a_command_line() -> None:
    argv = ["vllm", "--api-key", "sk-1", "--hf-token=hf_2", "--max-tokens", "9", "--model", "m"]
    assert redact_argv(argv) == [
        "vllm",
        "--api-key",
        MASK,
        f"--hf-token={MASK}",
        "--max-tokens",
        "9",
        "--model",
        "m",
    ]


def test_it_keeps_secrets_out_of_audit_rows(transactional_db: None) -> None:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("root", "r@example.com", "pw-1234567"))
    body = {
        "name": "c",
        "model": "m",
        "loader": "simulated",
        "runtime": "docker",
        "docker_options": {"environment": {"HF_TOKEN": "hf_secret_value"}},
        "command": ["python", "-m", "x", "--api-key", "sk-secret-value"],
    }
    assert client.post("/api/deployments/", body, format="json").status_code == 201
    row = AuditEntry.objects.get(action="create")
    assert "secret_value" not in str(row.after)
    assert row.after is not None
    assert row.after["docker_options"]["environment"] == {"HF_TOKEN": MASK}


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("http://user:pw@h:8/x.gguf", f"http://{MASK}@h:8/x.gguf"),
        ("https://u:p@ss@h/x", f"https://{MASK}@h/x"),  # a password holding an @
        ("pulling https://h/x?token=t&a=1 failed", f"pulling https://h/x?token={MASK}&a=1 failed"),
        ("https://h/x?access_token=t", f"https://h/x?access_token={MASK}"),
        ("https://h/x?sv=1&sig=s", f"https://h/x?sv=1&sig={MASK}"),
        (
            "https://b.s3.amazonaws.com/m?X-Amz-Credential=AK&X-Amz-Signature=s&X-Amz-Date=1",
            f"https://b.s3.amazonaws.com/m?X-Amz-Credential={MASK}&X-Amz-Signature={MASK}"
            "&X-Amz-Date=1",
        ),
        ("https://h/x?X-Goog-Signature=s", f"https://h/x?X-Goog-Signature={MASK}"),
    ],
)
def test_it_masks_the_credentials_of_a_url_in_a_text(text: str, masked: str) -> None:
    assert redact_urls(text) == masked
