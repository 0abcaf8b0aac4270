"""A model pulled from a path on the host: each file hard-linked where the store shares its
file system (no copy, no space), else copied. A link inside a folder is followed only where
it stays in the folder or in MSHIP_MODEL_DIRS (else a user who may only pull could copy any
file Modelship can read into a model), unless the puller may reach the host."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from deployments.host_access import outside_model_dirs
from deployments.store.job import Job, PullFailed

if TYPE_CHECKING:
    from deployments.store.sources import Source

CHUNK = 1 << 20


def fetch(source: Source, job: Job) -> Path:
    root = Path(source.ref)
    if not job.may_reach_host and outside_model_dirs(source.ref, always_path=True):
        # Asked as a path inside; a link put there since may lead out.
        raise PullFailed(f"{root} lies outside MSHIP_MODEL_DIRS", keep=False)
    if not root.exists():
        raise PullFailed(f"{root} does not exist", keep=False)
    real_root = Path(os.path.realpath(root))
    files = list(walk(root, real_root, job.may_reach_host))
    job.expect(sum(size for _, _, size in files))
    job.staging.mkdir(parents=True, exist_ok=True)
    for source_file, relative, _ in files:
        target = job.staging / relative if relative else job.staging / root.name
        target.parent.mkdir(parents=True, exist_ok=True)
        place(source_file, target, job)
    return job.staging if root.is_dir() else job.staging / root.name


def walk(root: Path, real_root: Path, may_reach_host: bool) -> list[tuple[Path, str, int]]:
    """(file, its path within the model, size) for each file."""
    if not root.is_dir():
        return [(real_root, "", real_root.stat().st_size)]
    found = []
    for folder, _, names in os.walk(root, followlinks=False):
        for name in names:
            path = Path(folder, name)
            real = os.path.realpath(path)
            inside = real.startswith(str(real_root) + "/")
            if not (inside or may_reach_host or outside_model_dirs(real, always_path=True) is None):
                raise PullFailed(
                    f"{path} links to {real}, outside the folder and MSHIP_MODEL_DIRS"
                    " (pulling it needs the run_arbitrary_engine permission)",
                    keep=False,
                )
            if not os.path.isfile(real):
                raise PullFailed(f"{path} is not a regular file", keep=False)
            found.append((Path(real), str(path.relative_to(root)), os.path.getsize(real)))
    return found


def place(source: Path, target: Path, job: Job) -> None:
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
        job.advance(source.stat().st_size)
        return
    except OSError:
        pass  # another file system, or links not allowed: a copy
    with source.open("rb") as reader, target.open("wb") as sink:
        while chunk := reader.read(CHUNK):
            sink.write(chunk)
            job.advance(len(chunk))
    shutil.copystat(source, target)
