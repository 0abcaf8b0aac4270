"""/api/keys/: keys for scripts without the admin: the secret shown once, restricted,
revoked, every change audited."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from rest_framework.test import APIClient

from deployments.models import AuditEntry
from openai_api.models import ApiKey, hash_secret
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment


@pytest.fixture
def staff(db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    return client


def chat(url: str, secret: str, model: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {secret}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


@pytest.mark.sample("rest")
def test_it_creates_restricts_and_revokes_a_key_that_the_gateway_honours(
    staff: APIClient, gateway_url: str, serving: Callable[..., Deployment], site: Any
) -> None:
    serving("one")
    serving("two")
    made = staff.post("/api/keys/", {"name": "ci-bot", "requests_per_minute": 100}, format="json")
    assert made.status_code == 201
    body = made.json()
    secret = body["key"]
    assert secret.startswith(body["prefix"] + "-") and body["allowed_models"] == []
    stored = ApiKey.objects.get(pk=body["id"])
    assert stored.secret_hash == hash_secret(secret.split("-", 2)[2])
    seen_by_gateway(lambda s: stored.prefix in s.keys)
    assert chat(gateway_url, secret, "two").status_code == 200

    listed = staff.get("/api/keys/").json()["results"]
    assert [k["name"] for k in listed] == ["ci-bot"] and "key" not in listed[0]
    assert (listed[0]["rate_per_minute"], listed[0]["rate_from"]) == (100, "key")
    unset = staff.post("/api/keys/", {"name": "plain"}, format="json").json()
    site.MSHIP_DEFAULT_RPM = 6000
    shown = staff.get(f"/api/keys/{unset['id']}/").json()
    assert (shown["rate_per_minute"], shown["rate_from"]) == (6000, "site default")
    site.MSHIP_DEFAULT_RPM = 0
    assert staff.get(f"/api/keys/{unset['id']}/").json()["rate_per_minute"] is None  # no limit
    staff.delete(f"/api/keys/{unset['id']}/")
    assert secret not in staff.get(f"/api/keys/{body['id']}/").content.decode()

    restricted = staff.patch(f"/api/keys/{body['id']}/", {"allowed_models": ["one"]}, format="json")
    assert restricted.status_code == 200 and restricted.json()["allowed_models"] == ["one"]
    seen_by_gateway(lambda s: s.keys[stored.prefix].allowed_models == frozenset({"one"}))
    assert chat(gateway_url, secret, "two").status_code == 404
    assert chat(gateway_url, secret, "one").status_code == 200

    revoked = staff.post(f"/api/keys/{body['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    seen_by_gateway(lambda s: s.keys[stored.prefix].revoked)
    assert chat(gateway_url, secret, "one").status_code == 401

    actions = list(
        AuditEntry.objects.filter(object_repr__contains="ci-bot")
        .order_by("time")
        .values_list("action", flat=True)
    )
    assert actions == ["api_key_create", "api_key_change", "api_key_revoke"]
    assert all(secret not in str(row.after) for row in AuditEntry.objects.all())


def test_it_answers_bad_key_input_with_field_errors(staff: APIClient) -> None:
    assert staff.post("/api/keys/", {}, format="json").json()["name"]
    bad = staff.post(
        "/api/keys/",
        {"name": "x", "allowed_models": "chat", "requests_per_minute": -1},
        format="json",
    )
    assert bad.status_code == 400
    assert set(bad.json()) == {"allowed_models", "requests_per_minute"}
    assert staff.delete("/api/keys/1/").status_code == 405
    assert not ApiKey.objects.exists()
    for value in ("urgent", -101, False):
        refused = staff.post("/api/keys/", {"name": "x", "priority": value}, format="json")
        assert refused.status_code == 400 and set(refused.json()) == {"priority"}, value
    refused = staff.post("/api/keys/", {"name": "x", "max_concurrency": 0}, format="json")
    assert refused.status_code == 400 and set(refused.json()) == {"max_concurrency"}
    body = {"name": "batch", "priority": "low", "max_concurrency": 2}
    low = staff.post("/api/keys/", body, format="json")
    assert low.status_code == 201 and low.json()["priority"] == -10
    assert low.json()["max_concurrency"] == 2
    assert ApiKey.objects.get(name="batch").priority == -10


def test_it_lets_only_users_with_the_key_permissions_manage_keys(db: None) -> None:
    viewer = User.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    client = APIClient()
    client.force_authenticate(viewer)
    assert client.get("/api/keys/").status_code == 200
    assert client.post("/api/keys/", {"name": "x"}, format="json").status_code == 403
    key, _ = ApiKey.issue("held")
    assert client.post(f"/api/keys/{key.pk}/revoke/").status_code == 403
    assert APIClient().get("/api/keys/").status_code in (401, 403)
    assert not ApiKey.objects.get(pk=key.pk).revoked


def test_it_lists_keys_in_the_admin_in_words(db: None, site: Any) -> None:
    """Active and revoked as words (a boolean column drew an active key as a red cross), and
    the rate the gateway applies, the key's own or the site's default, named."""
    site.MSHIP_DEFAULT_RPM = 6000
    ApiKey.issue("own-rate", requests_per_minute=30)
    ApiKey.issue("gone", revoked=True)
    browser = Client()
    browser.force_login(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    page = browser.get("/admin/openai_api/apikey/").content.decode()
    rows = {
        name: re.sub(r"<[^>]+>", " ", row)
        for row in re.findall(r"<tr[^>]*>.*?</tr>", page, re.S)
        for name in ("own-rate", "gone")
        if f">{name}<" in row
    }
    assert re.search(r"\bactive\b.*30/min \(key\)", rows["own-rate"], re.S)
    assert re.search(r"\brevoked\b.*6,000/min \(site default\)", rows["gone"], re.S)
    assert "icon-no" not in page and "icon-yes" not in page
