"""`modelship pull` and `modelship models` against a served site whose cluster runs the
pulls, from a local Hugging Face-compatible hub."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from deployments.tiny_model import write as write_tiny
from tests.model_host import ModelHost, model_host
from tests.test_cli import cli

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[ModelHost]:
    write_tiny(tmp_path / "hub" / "acme" / "tiny-GGUF" / "tiny.gguf")
    with model_host(tmp_path / "hub") as host:
        host.faults.slow_bytes_per_s = 400_000  # a second or so: the command follows it
        yield host


@pytest.fixture
def live_env(hub: ModelHost, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "MSHIP_MODEL_DIRS": str(tmp_path / "models")}


def test_it_pulls_lists_and_removes_stored_models(
    live: dict[str, str], hub: ModelHost, tmp_path: Path
) -> None:
    pulled = cli(live, "pull", "hf:acme/tiny-GGUF", "--name", "tiny")
    assert pulled.returncode == 0, pulled.stderr
    assert "tiny: gguf, 467.0 KiB, 1 checksum(s) verified" in pulled.stdout
    assert "deploy it as model: store:tiny (loader: llama_server)" in pulled.stdout
    assert (tmp_path / "models" / "store" / "tiny" / "tiny.gguf").is_file()
    again = cli(live, "pull", "hf:acme/tiny-GGUF", "--name", "tiny")
    assert "already in the store (store:tiny)" in again.stdout
    missing = cli(live, "pull", "hf:acme/none")
    assert missing.returncode == 1
    assert "acme/none: no such repository" in missing.stderr
    listed = cli(live, "models")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("tiny "))
    assert row.split() == ["tiny", "ready", "gguf", "467.0", "KiB", "118.0K", "F32", "32768", "-"]
    assert f"store {tmp_path / 'models' / 'store'}: 467.0 KiB in 1 model(s)" in listed.stdout
    assert "none: acme/none: no such repository" in listed.stdout  # the failed pull's reason
    shown = json.loads(cli(live, "models", "--json").stdout)
    assert {m["name"] for m in shown["models"]} == {"tiny", "none"}
    assert shown["disk"]["free_bytes"] > 0
    assert cli(live, "models", "rm", "tiny").stdout.strip() == "tiny: deleted"
    assert not (tmp_path / "models" / "store" / "tiny").exists()
    gone = cli(live, "models", "rm", "tiny")
    assert gone.returncode == 2 and "no stored model named 'tiny'" in gone.stderr
