"""Staff is not root: what a view-only, a change-only and an engine-running user may do,
through /api, the admin and `manage.py deploy --user`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from deployments.models import Deployment

if TYPE_CHECKING:
    from pathlib import Path

    from django.test import Client

SIM = {"name": "sim", "model": "simulated", "loader": "simulated", "memory_gib": 1}
ARBITRARY = {**SIM, "name": "shell", "command": ["/bin/sh", "-c", "id > /tmp/owned"]}

VIEW = ("view_deployment", "view_auditentry", "view_deploymentevent")
CHANGE = (*VIEW, "change_deployment")
MANAGE = (*CHANGE, "add_deployment", "delete_deployment")


def staff_user(name: str, perms: tuple[str, ...]) -> User:
    user = User.objects.create_user(name, password="pw-123456", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    return User.objects.get(pk=user.pk)  # a fresh object: no cached permissions


def api_as(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def sim(transactional_db: None) -> Deployment:
    return Deployment.objects.create(**SIM)


def test_it_lets_a_view_only_staff_user_look_and_do_nothing_else(sim: Deployment) -> None:
    api = api_as(staff_user("viewer", VIEW))
    assert api.get("/api/deployments/").status_code == 200
    assert api.get(f"/api/deployments/{sim.pk}/").status_code == 200
    assert api.get("/api/host").status_code == 200
    assert api.get("/api/audit/").status_code == 200
    assert api.post("/api/deployments/", {**SIM, "name": "new"}, format="json").status_code == 403
    assert api.post("/api/deployments/", ARBITRARY, format="json").status_code == 403
    patch = api.patch(f"/api/deployments/{sim.pk}/", {"memory_gib": 2}, format="json")
    assert patch.status_code == 403
    for action in ("start", "stop", "sleep", "wake"):
        assert api.post(f"/api/deployments/{sim.pk}/{action}/").status_code == 403
    assert api.patch(f"/api/deployments/{sim.pk}/mode/", {"mode": "on_demand"}).status_code == 403
    assert api.delete(f"/api/deployments/{sim.pk}/").status_code == 403
    sim.refresh_from_db()
    assert (sim.memory_gib, sim.mode, sim.state) == (1, None, "planned")
    assert not Deployment.objects.filter(name__in=["new", "shell"]).exists()


def test_it_shows_nothing_to_a_staff_user_without_model_permissions(sim: Deployment) -> None:
    api = api_as(staff_user("bare", ()))
    assert api.get("/api/deployments/").status_code == 403
    assert api.get("/api/host").status_code == 403


def test_it_lets_a_change_only_user_edit_but_not_choose_what_runs(sim: Deployment) -> None:
    api = api_as(staff_user("editor", CHANGE))
    assert (
        api.patch(f"/api/deployments/{sim.pk}/", {"memory_gib": 2}, format="json").status_code
        == 200
    )
    for field, value in (
        ("command", ["/bin/sh", "-c", "id"]),
        ("image", "attacker/image:latest"),
        ("docker_options", {"user": "root", "environment": {"LD_PRELOAD": "/tmp/x.so"}}),
    ):
        answer = api.patch(f"/api/deployments/{sim.pk}/", {field: value}, format="json")
        assert answer.status_code == 403, field
        assert [k.split(".")[0] for k in answer.json()] == [field]  # the field is named
    llama = Deployment.objects.create(name="llama", model="m.gguf", loader="llama_server")
    answer = api.patch(
        f"/api/deployments/{llama.pk}/", {"config": {"binary": "/bin/sh"}}, format="json"
    )
    assert answer.status_code == 403 and list(answer.json()) == ["config.binary"]
    assert api.post(f"/api/deployments/{sim.pk}/stop/").status_code in (200, 202, 409)
    assert api.post("/api/deployments/", {**SIM, "name": "new"}, format="json").status_code == 403
    sim.refresh_from_db()
    assert sim.command is None and sim.image == "" and sim.memory_gib == 2


def test_it_lets_only_a_superuser_set_a_command(
    transactional_db: None,
) -> None:
    api = api_as(staff_user("manager", MANAGE))
    assert api.post("/api/deployments/", SIM, format="json").status_code == 201
    assert api.post("/api/deployments/", ARBITRARY, format="json").status_code == 403
    root = User.objects.create_superuser("root", "r@example.com", "pw-123456")
    assert api_as(root).post("/api/deployments/", ARBITRARY, format="json").status_code == 201


def test_it_takes_no_basic_auth_unless_the_site_turns_it_on(
    sim: Deployment, live_server: Any
) -> None:
    User.objects.create_superuser("root", "r@example.com", "pw-123456")
    answer = httpx.get(live_server.url + "/api/deployments/", auth=("root", "pw-123456"))
    assert answer.status_code == 401


def test_it_keeps_a_view_only_user_from_changing_a_deployment_in_the_admin(
    client: Client, sim: Deployment
) -> None:
    client.force_login(staff_user("viewer", VIEW))
    url = f"/admin/deployments/deployment/{sim.pk}/change/"
    assert client.get(url).status_code == 200
    assert client.post(url, {"name": "renamed"}).status_code == 403
    listing = client.post(
        "/admin/deployments/deployment/", {"action": "start", "_selected_action": [sim.pk]}
    )
    assert listing.status_code in (200, 302)
    sim.refresh_from_db()
    assert (sim.name, sim.state) == ("sim", "planned")


def test_it_keeps_an_admin_editor_from_setting_the_engines_binary(
    client: Client, sim: Deployment
) -> None:
    client.force_login(staff_user("editor", CHANGE))
    url = f"/admin/deployments/deployment/{sim.pk}/change/"
    page = client.get(url).content.decode()
    assert 'name="command"' not in page and 'name="image"' not in page  # shown read-only
    form = {
        "name": "sim",
        "aliases": "[]",
        "model": "simulated",
        "loader": "simulated",
        "usecase": "generate",
        "runtime": "process",
        "config": '{"binary": "/bin/sh"}',
        "num_replicas": "1",
        "memory_gib": "1",
        "responses": "gateway",
    }
    answer = client.post(url, form)
    assert answer.status_code == 200 and "run_arbitrary_engine" in answer.content.decode()
    sim.refresh_from_db()
    assert sim.config == {}


def test_it_applies_a_models_file_as_a_user_within_their_permissions(
    transactional_db: None, tmp_path: Path
) -> None:
    staff_user("editor", MANAGE)
    file = tmp_path / "models.yaml"
    file.write_text(
        "models:\n"
        "  - {name: plain, model: simulated, loader: simulated, memory_gib: 1}\n"
        "  - {name: shell, model: simulated, loader: simulated, memory_gib: 1,"
        " command: [/bin/sh, -c, id]}\n"
    )
    with pytest.raises(CommandError, match="run_arbitrary_engine"):
        call_command("deploy", file=str(file), user="editor")
    assert not Deployment.objects.exists()  # nothing of the file was applied
    User.objects.create_superuser("root", "r@example.com", "pw-123456")
    call_command("deploy", file=str(file), user="root")
    assert set(Deployment.objects.values_list("name", flat=True)) == {"plain", "shell"}


def test_it_shows_the_api_schema_and_docs_to_staff_only(transactional_db: None) -> None:
    client = APIClient()
    assert client.get("/api/schema/").status_code in (401, 403)
    assert client.get("/api/docs/").status_code in (401, 403)
    client.force_authenticate(staff_user("viewer", VIEW))
    assert client.get("/api/schema/").status_code == 200
