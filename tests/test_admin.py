"""The admin: deployments with state badges and actions; audit and events read-only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from deployments import deployer
from deployments.models import AuditEntry, Deployment
from ondemand.models import LiteLLMStatus
from openai_api.models import ApiKey
from tests.conftest import REPO

if TYPE_CHECKING:
    from django.test import Client


@pytest.fixture
def staff(client: Client, transactional_db: None) -> Client:
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw-123456"))
    return client


def form_of(name: str, **fields: Any) -> dict[str, Any]:
    """What the deployment form posts for a simulated deployment (every field it requires)."""
    return {
        "name": name,
        "aliases": "",
        "model": "simulated",
        "loader": "simulated",
        "usecase": "generate",
        "runtime": "process",
        "image": "",
        "command": "",
        "config": "{}",
        "num_replicas": 1,
        "memory_gib": 1,
        "num_gpus": "",
        "mode": "",
        "idle_timeout_s": "",
        "evictable": "on",  # checked, as the form shows it
        "responses": "gateway",
        **fields,
    }


@pytest.mark.parametrize("synced", [True, False], ids=["litellm_ready", "last_sync_failed"])
def test_it_offers_on_demand_for_a_new_deployment_where_litellm_is_ready(
    staff: Client, settings: Any, synced: bool
) -> None:
    settings.MSHIP_LITELLM_URL = "http://litellm.internal:4000"
    LiteLLMStatus.objects.create(pk=1, ok=synced, error="" if synced else "LiteLLM answered 500")
    page = staff.get("/admin/deployments/deployment/add/").content.decode()
    offered = re.search(r'<select name="mode"[^>]*>.*?</select>', page, re.S)
    assert offered is not None
    chosen = re.search(r'<option value="(\w*)" selected>', offered.group(0))
    assert (chosen.group(1) if chosen else "") == ("on_demand" if synced else "")
    # /api's default stays always on: the deploy form chooses, as the seed's wizard does.
    api = APIClient()
    api.force_authenticate(User.objects.get(username="admin"))
    body = {"name": "by-api", "model": "simulated", "loader": "simulated", "memory_gib": 1}
    made = api.post("/api/deployments/", body, format="json").json()
    assert made["effective_mode"] == "always_on"


@pytest.mark.sample("admin")
def test_it_lists_deployments_with_state_badges(staff: Client, make_deployment: Any) -> None:
    make_deployment("shown", mode="on_demand")
    page = staff.get("/admin/deployments/deployment/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "shown" in html
    assert ">planned · idle</span>" in html and 'data-live="state"' in html
    assert "on demand" in html
    assert "sleeping" not in html  # one vocabulary: an on-demand one with no engine is idle
    assert "Memory: 0.0 of 8.0 GiB held, 8.0 GiB free" in " ".join(html.split())


@pytest.mark.usefixtures("engines")
def test_it_queues_actions_and_reports_what_cannot_be_done(
    staff: Client, make_deployment: Any
) -> None:
    hog = make_deployment("hog", memory_gib=7.5)
    deployer.restart(hog.pk)
    small = make_deployment("small", memory_gib=0.5)
    big = make_deployment("big", memory_gib=2)
    page = staff.post(
        "/admin/deployments/deployment/",
        {"action": "start", "_selected_action": [small.pk, big.pk]},
        follow=True,
    )
    html = "\n".join(str(m) for m in page.context["messages"])
    assert "small: start queued" in html
    assert "big: big needs 2.0 GiB but 0.5 GiB of 8.0 GiB is free" in html
    assert list(
        AuditEntry.objects.filter(action="start").values_list("object_repr", flat=True)
    ) == ["small"]


@pytest.mark.sample("admin")
def test_it_audits_a_change_made_in_the_admin(staff: Client, make_deployment: Any) -> None:
    deployment = make_deployment("edited")
    form = {
        "name": "edited",
        "aliases": "[]",
        "model": "simulated",
        "loader": "simulated",
        "usecase": "generate",
        "runtime": "process",
        "image": "",
        "command": "null",
        "config": "{}",
        "num_replicas": 1,
        "memory_gib": 3,
        "num_gpus": "",
        "mode": "",
        "idle_timeout_s": "",
        "evictable": "on",
        "responses": "gateway",
    }
    answer = staff.post(f"/admin/deployments/deployment/{deployment.pk}/change/", form)
    assert answer.status_code == 302
    entry = AuditEntry.objects.get(action="update")
    assert ((entry.before or {})["memory_gib"], (entry.after or {})["memory_gib"]) == (1.0, 3.0)
    assert entry.actor == "admin"
    assert Deployment.objects.get(pk=deployment.pk).memory_gib == 3
    # The trail shows it to the second, with the fields it changed, each from what to what.
    listed = staff.get("/admin/deployments/auditentry/").content.decode()
    row = next(r for r in re.findall(r"<tr[^>]*>.*?</tr>", listed, re.S) if ">update<" in r)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row)
    assert re.search(r'class="field-changed">memory_gib<', row)
    shown = staff.get(f"/admin/deployments/auditentry/{entry.pk}/change/").content.decode()
    assert re.search(
        r"<tr><th>memory_gib</th><td><code>1.0</code></td><td><code>3.0</code></td></tr>", shown
    )


def test_it_keeps_audit_and_events_read_only(staff: Client) -> None:
    assert staff.get("/admin/deployments/auditentry/add/").status_code == 403
    assert staff.get("/admin/deployments/deploymentevent/add/").status_code == 403
    assert staff.get("/admin/deployments/auditentry/").status_code == 200


def test_it_audits_api_keys_and_shows_a_new_one_once_without_a_cookie(staff: Client) -> None:
    made = staff.post(
        "/admin/openai_api/apikey/add/",
        {"name": "ci", "allowed_models": "[]", "requests_per_minute": ""},
    )
    assert made.status_code == 302
    assert "messages" not in made.cookies  # the secret is not carried in a cookie

    shown = staff.get(made["Location"]).content.decode()
    key = ApiKey.objects.get(name="ci")
    secret = re.search(rf"msk-{key.prefix}-[A-Za-z0-9_-]{{20,}}", shown)
    assert secret is not None  # the whole key, this once
    assert secret.group() not in staff.get(made["Location"]).content.decode()
    staff.post(
        "/admin/openai_api/apikey/",
        {"action": "revoke", "_selected_action": [key.pk]},
    )
    key.refresh_from_db()
    assert key.revoked
    rows = list(AuditEntry.objects.filter(action__startswith="api_key").order_by("id"))
    assert [r.action for r in rows] == ["api_key_create", "api_key_revoke"]
    assert all(key.secret_hash not in str(r.after) for r in rows)
    assert rows[1].before["revoked"] is False and rows[1].after["revoked"] is True  # type: ignore[index]


def test_it_sends_secure_cookies_and_hsts_behind_tls() -> None:
    script = (
        "import django; django.setup(); from django.conf import settings as s;"
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS)"
    )
    env = {"DJANGO_SETTINGS_MODULE": "modelship_site.settings", "MSHIP_HTTPS": "true"}

    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["True", "True", "31536000"]


def test_it_shows_what_an_on_demand_deployment_is_judged_idle_by(
    staff: Client, make_deployment: Any
) -> None:
    voice = make_deployment("voice", loader="tts", usecase="tts", model="espeak-ng", config={})
    voice.mode = "on_demand"
    voice.save()
    chat = make_deployment("chat", mode="on_demand")
    pinned = make_deployment("pinned")

    def shown(deployment: Any) -> str:
        page = staff.get(f"/admin/deployments/deployment/{deployment.pk}/change/")
        block = page.content.decode().split("Judged idle by", 1)[1]
        return block.split('<div class="readonly">', 1)[1].split("</div>", 1)[0]

    assert shown(voice) == "slots"  # espeak has no load gauges: the gateway's slots alone
    assert shown(chat) == "slots and engine gauges"
    assert shown(pinned) == "—"


def test_it_shows_aliases_as_names_and_an_unset_command_as_empty(
    staff: Client, make_deployment: Any
) -> None:
    deployment = make_deployment("plain", aliases=["chat", "helper"])
    page = staff.get(f"/admin/deployments/deployment/{deployment.pk}/change/").content.decode()
    assert 'name="aliases" value="chat, helper"' in page
    command_box = re.search(r'<textarea name="command"[^>]*>([^<]*)</textarea>', page)
    assert command_box is not None and command_box.group(1).strip() == ""
    assert "llama_server_config" in page  # the loader's options say where they come from
    form = form_of("plain", aliases="chat, talk")
    assert (
        staff.post(f"/admin/deployments/deployment/{deployment.pk}/change/", form).status_code
        == 302
    )
    deployment.refresh_from_db()
    assert deployment.aliases == ["chat", "talk"] and deployment.command is None
    bad = staff.post(
        f"/admin/deployments/deployment/{deployment.pk}/change/",
        {**form, "aliases": "chat, bad name!", "command": "[1, 2"},
    ).content.decode()
    assert "errorlist" in bad and Deployment.objects.get(pk=deployment.pk).aliases == [
        "chat",
        "talk",
    ]


@pytest.mark.sample("admin")
@pytest.mark.usefixtures("engines")
def test_it_operates_a_deployment_from_its_page(staff: Client, make_deployment: Any) -> None:
    """The buttons on a deployment's page: each one operation (through the operations
    layer, audited), its outcome as the page's message; the live panel and log are there."""
    shown = make_deployment("shown")
    url = f"/admin/deployments/deployment/{shown.pk}/"
    page = staff.get(url + "change/").content.decode()
    assert 'id="live-panel"' in page and 'id="live-log"' in page
    assert f'action="{url}operate/"' in page
    # What it may do now, enabled; no sleep for an engine that cannot, no switch to the
    # mode it is in (always on).
    buttons = re.findall(r'<button[^>]*name="op" value="(\w+)"([^>]*)>', page)
    assert [(op, "disabled" in rest) for op, rest in buttons] == [
        ("start", False), ("stop", True), ("wake", True), ("on_demand", False)
    ]  # fmt: skip

    answer = staff.post(url + "operate/", {"op": "start"}, follow=True)
    assert answer.redirect_chain == [(url + "change/", 302)]
    assert [str(m) for m in answer.context["messages"]] == ["shown: start queued"]
    Deployment.objects.filter(pk=shown.pk).update(state="ready")
    again = staff.post(url + "operate/", {"op": "start"}, follow=True)  # a stale page's button
    assert [str(m) for m in again.context["messages"]] == ["shown is ready: nothing to start"]
    assert AuditEntry.objects.filter(object_repr="shown", action="start").count() == 1
    answer = staff.post(url + "operate/", {"op": "on_demand"}, follow=True)
    assert [str(m) for m in answer.context["messages"]] == ["shown: mode on_demand"]
    assert Deployment.objects.get(pk=shown.pk).mode == "on_demand"
    same = staff.post(url + "operate/", {"op": "on_demand"}, follow=True)  # nothing, no row
    assert [str(m) for m in same.context["messages"]] == ["shown: mode already on_demand"]
    actions = AuditEntry.objects.filter(object_repr="shown").values_list("action", flat=True)
    assert sorted(actions) == ["ondemand_mode", "start"]

    answer = staff.post(url + "operate/", {"op": "explode"}, follow=True)
    assert [str(m) for m in answer.context["messages"]] == ["no such operation: 'explode'"]
    assert staff.get(url + "operate/").status_code == 405
    missing = "/admin/deployments/deployment/9999/operate/"
    assert staff.post(missing, {"op": "stop"}).status_code == 404


def test_it_lets_only_who_may_change_a_deployment_press_its_buttons(
    client: Client, make_deployment: Any
) -> None:
    shown = make_deployment("shown")
    viewer = User.objects.create_user("viewer", password="pw-123456", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_deployment"))
    client.force_login(viewer)
    url = f"/admin/deployments/deployment/{shown.pk}/"
    page = client.get(url + "change/").content.decode()
    assert 'id="live-panel"' in page and 'name="op"' not in page
    assert client.post(url + "operate/", {"op": "start"}).status_code == 403
    assert not AuditEntry.objects.filter(action="start").exists()


def test_it_edits_the_loaders_options_as_fields_with_their_help(
    staff: Client, make_deployment: Any
) -> None:
    config = {"reply": "42", "tokens_per_second": 200, "echo": True}
    deployment = make_deployment("optioned", config=config)
    url = f"/admin/deployments/deployment/{deployment.pk}/change/"
    page = staff.get(url).content.decode()
    assert 'name="option__simulated__reply" value="&quot;42&quot;"' in page  # text stays text
    assert 'name="option__simulated__tokens_per_second" value="200"' in page
    assert 'name="option__simulated__echo" value="true"' in page
    assert "what it answers" in page and "simulated options (simulated_config)" in page
    assert "modelship/deployment_form.js" in page
    form = form_of(
        "optioned",
        config=json.dumps(config),  # the page hides it for a loader with option fields
        option__simulated__reply="hello there",
        option__simulated__tokens_per_second="50",
        option__simulated__echo="",
    )
    assert staff.post(url, form).status_code == 302
    deployment.refresh_from_db()
    assert deployment.config == {"reply": "hello there", "tokens_per_second": 50}
    change = AuditEntry.objects.filter(object_repr="optioned", action="update").last()
    assert change is not None and (change.after or {})["config"]["tokens_per_second"] == 50

    # A post of the JSON box alone (a script's) sets the config from it.
    assert staff.post(url, form_of("optioned", config='{"reply": "boxed"}')).status_code == 302
    assert Deployment.objects.get(pk=deployment.pk).config == {"reply": "boxed"}

    # A refusal that names an option is shown next to it; nothing is saved.
    wrong = {**form, "loader": "llama_server", "option__llama_server__extra_args": "--flag"}
    page = staff.post(url, wrong).content.decode()
    row = re.search(r'<div class="form-row errors field-option__llama_server__extra_args">'
                    r'.*?</div>', page, re.S)  # fmt: skip
    assert row is not None and "must be a list of strings" in page
    assert Deployment.objects.get(pk=deployment.pk).loader == "simulated"
