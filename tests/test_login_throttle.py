"""Failed sign-ins throttle further tries, for a user name and for a client address: the
admin's login page says so, /api answers a token guesser 429 (issue 35, item 5)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from deployments.api.tokens import issue_token
from deployments.auth_models import LoginFailure

LIMIT = 3


@pytest.fixture
def throttled(transactional_db: None, settings: Any) -> User:
    settings.MSHIP_LOGIN_MAX_FAILURES = LIMIT
    settings.MSHIP_LOGIN_WINDOW_S = 600
    return User.objects.create_superuser("ops", "o@example.com", "right-pass-1")


def sign_in(client: Client, username: str, password: str) -> Any:
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password})


def test_it_refuses_the_admin_login_after_failures_and_says_so(throttled: User) -> None:
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(LIMIT):
        page = sign_in(client, "ops", "wrong")
        assert page.status_code == 200
        assert "correct username and password" in page.content.decode()
    # The right password too: a guess that would be right teaches nothing now.
    page = sign_in(client, "ops", "right-pass-1")
    assert page.status_code == 200
    assert "Too many failed sign-ins: try again in 10 minutes." in page.content.decode()
    assert "_auth_user_id" not in client.session


def test_it_throttles_a_user_name_from_any_address(throttled: User) -> None:
    for index in range(LIMIT):
        sign_in(Client(REMOTE_ADDR=f"198.51.100.{index}"), "OPS", "wrong")
    page = sign_in(Client(REMOTE_ADDR="192.0.2.1"), "ops", "right-pass-1")
    assert "Too many failed sign-ins" in page.content.decode()
    # Another user, from an address that has not failed, signs in.
    User.objects.create_superuser("other", "x@example.com", "other-pass-1")
    page = sign_in(Client(REMOTE_ADDR="192.0.2.1"), "other", "other-pass-1")
    assert page.status_code == 302


def test_it_throttles_an_address_trying_many_user_names(throttled: User) -> None:
    client = Client(REMOTE_ADDR="203.0.113.9")
    for index in range(LIMIT):
        sign_in(client, f"guess{index}", "wrong")
    page = sign_in(client, "ops", "right-pass-1")
    assert "Too many failed sign-ins" in page.content.decode()
    assert sign_in(Client(REMOTE_ADDR="203.0.113.10"), "ops", "right-pass-1").status_code == 302


def test_it_lets_a_login_in_again_once_the_window_has_passed(throttled: User) -> None:
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(LIMIT):
        sign_in(client, "ops", "wrong")
    assert "Too many" in sign_in(client, "ops", "right-pass-1").content.decode()
    LoginFailure.objects.update(time="2000-01-01T00:00:00Z")  # the window has passed
    assert sign_in(client, "ops", "right-pass-1").status_code == 302
    assert not LoginFailure.objects.filter(key="user:ops").exists()  # a success clears them


def test_it_answers_a_token_guesser_429_in_json(throttled: User) -> None:
    token = issue_token(throttled)
    guesser = APIClient(REMOTE_ADDR="203.0.113.66")
    for index in range(LIMIT):
        answer = guesser.get("/api/deployments/", HTTP_AUTHORIZATION=f"Token guess{index}")
        assert answer.status_code == 401
    answer = guesser.get("/api/deployments/", HTTP_AUTHORIZATION=f"Token {token}")
    assert answer.status_code == 429
    assert answer["Content-Type"].startswith("application/json")
    assert "Too many failed sign-ins" in answer.json()["detail"]
    assert 0 < int(answer["Retry-After"]) <= 600
    # Another address's client with the token is not held up.
    other = APIClient(REMOTE_ADDR="203.0.113.67")
    assert other.get("/api/deployments/", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_it_throttles_basic_auth_passwords(throttled: User, settings: Any) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    }
    guesser = APIClient(REMOTE_ADDR="203.0.113.70")
    for _ in range(LIMIT):
        guesser.credentials(HTTP_AUTHORIZATION="Basic b3BzOndyb25n")  # ops:wrong
        assert guesser.get("/api/deployments/").status_code == 401
    guesser.credentials(HTTP_AUTHORIZATION="Basic b3BzOnJpZ2h0LXBhc3MtMQ==")  # ops:right-pass-1
    assert guesser.get("/api/deployments/").status_code in (401, 403)
