"""The model store's test fixtures: a store in the test's own folder, a local Hugging Face-
compatible hub and file host (tests/model_host.py) it pulls from, the tiny GGUF's bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from deployments.tiny_model import write as write_tiny
from tests.model_host import ModelHost, model_host

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


class Store:
    def __init__(self, root: Path, host: ModelHost) -> None:
        self.root = root
        self.host = host
        self.hub = host.root

    def repo(self, name: str, files: dict[str, bytes]) -> None:
        for path, data in files.items():
            target = self.hub / name / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    def staged(self) -> list[Path]:
        """What pulls left in their own folders (nothing, once each has ended)."""
        pulls = self.root / ".pulls"
        return list(pulls.iterdir()) if pulls.exists() else []

    def gets(self, suffix: str) -> list[dict[str, str]]:
        requests = self.host.requests
        return [r for r in requests if r["method"] == "GET" and r["path"].endswith(suffix)]


@pytest.fixture
def store(site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    root = (tmp_path / "models").resolve()
    root.mkdir()
    site.MSHIP_MODEL_DIRS = [str(root), str((tmp_path / "more").resolve())]
    site.MSHIP_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    site.MSHIP_MODEL_STORE_MIN_FREE_GIB = 0.0
    (tmp_path / "hub").mkdir()
    with model_host(tmp_path / "hub") as host:
        monkeypatch.setenv("HF_ENDPOINT", host.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield Store(root / "store", host)  # the store's own folder in the first model folder


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny(tmp_path_factory.mktemp("tiny") / "tiny.gguf").read_bytes()
