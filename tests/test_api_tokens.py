"""/api tokens are stored as their SHA-256 digest: the database signs nobody in, the tokens
DRF's authtoken app made keep working after the migration, and `make run`'s var/admin_token
still signs the admin in (issue 35, item 5)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from deployments.api.tokens import digest_of, issue_token
from deployments.auth_models import ApiToken
from deployments.management.commands.ensure_admin import ensure_admin

if TYPE_CHECKING:
    from pathlib import Path


pytestmark = [pytest.mark.postgres]


def get_as(token: str, path: str = "/api/deployments/") -> Any:
    return APIClient().get(path, HTTP_AUTHORIZATION=f"Token {token}")


def test_it_keeps_only_the_tokens_digest(transactional_db: None) -> None:
    user = User.objects.create_superuser("ops", "o@example.com", "pw-123456")
    token = issue_token(user)
    assert len(token) == 40
    assert get_as(token).status_code == 200
    row = ApiToken.objects.values().get(user=user)
    assert token not in str(row)
    assert row["digest"] == digest_of(token)
    # Its digest is not a token; a new token replaces the old one.
    assert get_as(row["digest"]).status_code == 401
    newer = issue_token(user)
    assert get_as(token).status_code == 401
    assert get_as(newer).status_code == 200


def test_it_refuses_an_inactive_users_token(transactional_db: None) -> None:
    user = User.objects.create_superuser("ops", "o@example.com", "pw-123456")
    token = issue_token(user)
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert get_as(token).status_code == 401


def test_it_hashes_the_tokens_drf_kept_in_clear_and_they_keep_working(
    transactional_db: None,
) -> None:
    user = User.objects.create_superuser("ops", "o@example.com", "pw-123456")
    call_command("migrate", "deployments", "0012", verbosity=0)
    old_key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:  # rest_framework.authtoken's table, as it made it
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS authtoken_token (key varchar(40) PRIMARY KEY,"
            " created timestamp NOT NULL, user_id integer NOT NULL UNIQUE)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
            [old_key, "2026-01-02 03:04:05", user.pk],
        )
    try:
        call_command("migrate", "deployments", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM authtoken_token")
            assert cursor.fetchone() == (0,)  # no key left in clear
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE authtoken_token")
    assert get_as(old_key).status_code == 200
    assert ApiToken.objects.get(user=user).created.year == 2026
    assert old_key not in str(list(ApiToken.objects.values()))


def test_it_writes_the_admins_token_for_make_run(
    transactional_db: None, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    login = ensure_admin()
    assert login.token is not None
    written = (tmp_path / "admin_token").read_text().strip()
    assert written == login.token
    assert get_as(written).status_code == 200
    assert ensure_admin().token is None  # made once; the file keeps it
    assert get_as(written).status_code == 200


@pytest.mark.parametrize("header", ["Token", "Token a b", "Token \xff"])
def test_it_answers_a_malformed_token_with_401(transactional_db: None, header: str) -> None:
    answer = APIClient().get("/api/deployments/", HTTP_AUTHORIZATION=header)
    assert answer.status_code == 401
    assert answer.json()["detail"]


def test_it_makes_a_users_token_from_the_command_line(transactional_db: None) -> None:
    User.objects.create_superuser("ops", "o@example.com", "pw-123456")
    out = io.StringIO()
    call_command("api_token", "ops", stdout=out)
    token = out.getvalue().strip()
    assert get_as(token).status_code == 200
    with pytest.raises(CommandError, match="has a token already"):
        call_command("api_token", "ops", "--keep", stdout=io.StringIO())
    with pytest.raises(CommandError, match="No user"):
        call_command("api_token", "nobody", stdout=io.StringIO())
    assert get_as(token).status_code == 200


def test_it_lists_tokens_in_the_admin_without_their_digest_and_revokes_by_deleting(
    transactional_db: None,
) -> None:
    root = User.objects.create_superuser("root", "r@example.com", "pw-123456")
    token = issue_token(root)
    row = ApiToken.objects.get(user=root)
    browser = Client()
    browser.force_login(root)
    page = browser.get("/admin/deployments/apitoken/")
    assert page.status_code == 200
    assert "root" in page.content.decode()
    assert row.digest not in page.content.decode()
    assert browser.get("/admin/deployments/apitoken/add/").status_code == 403
    answer = browser.post(f"/admin/deployments/apitoken/{row.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302
    assert get_as(token).status_code == 401
