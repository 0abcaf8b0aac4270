"""A model pulled from a Hugging Face repository, through `huggingface_hub`: HF_ENDPOINT
(a site's mirror) and HF_TOKEN as the environment gives them. The repository's listing is
read once, pinned to its commit; the files the include patterns pick are fetched one by
one into the pull's folder (the files a cut pull finished are kept; huggingface_hub fetches
a file cut off again whole), and each is
checked against the hash the Hub published: an LFS file's SHA-256, a small file's Git blob
id."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
from typing import TYPE_CHECKING, Any

import huggingface_hub
from django.conf import settings
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.tqdm import tqdm as hf_tqdm

from deployments.store.job import Job, PullFailed, folder_size

if TYPE_CHECKING:
    from pathlib import Path

    from deployments.store.sources import Source

MAX_FILES = 10_000
CHUNK = 1 << 20


def fetch(source: Source, job: Job) -> Path:
    endpoint = os.environ.get("HF_ENDPOINT") or None
    token = os.environ.get("HF_TOKEN") or None
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    # Read by huggingface_hub at each download (MSHIP_HUB_XET says why it is off), and the
    # size of the chunks it reads, after each of which a cancel or a full disk stops it.
    huggingface_hub.constants.HF_HUB_DISABLE_XET = not settings.MSHIP_HUB_XET
    huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = CHUNK
    where = f"{source.ref}" + (f"@{source.revision}" if source.revision else "")
    try:
        info = api.model_info(source.ref, revision=source.revision or None, files_metadata=True)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise PullFailed(f"{where}: no such repository, or not for this token", False) from exc
    except RevisionNotFoundError as exc:
        raise PullFailed(f"{where}: no such revision", keep=False) from exc
    except HfHubHTTPError as exc:
        raise PullFailed(f"{where}: the Hub answered {exc}") from exc
    files = picked(info.siblings or [], source.include)
    if not files:
        raise PullFailed(f"{where}: no file matches {list(source.include)}", keep=False)
    job.watch = job.staging
    job.expect(sum(f.size or 0 for f in files), already=existing(job.staging))
    for sibling in files:
        job.check()
        try:
            path = huggingface_hub.hf_hub_download(
                source.ref,
                sibling.rfilename,
                revision=info.sha,
                local_dir=job.staging,
                endpoint=endpoint,
                token=token,
                tqdm_class=watching(job),
            )
        except EntryNotFoundError as exc:
            raise PullFailed(f"{where}: {sibling.rfilename} is listed but missing") from exc
        except HfHubHTTPError as exc:
            raise PullFailed(f"{where}: {sibling.rfilename}: the Hub answered {exc}") from exc
        verify(sibling, path, job)
    shutil.rmtree(job.staging / ".cache", ignore_errors=True)  # the resume bookkeeping
    return job.staging


def watching(job: Job) -> type[hf_tqdm]:
    """huggingface_hub's progress bar for one pull: told of each chunk as it is written, it
    stops the download there where the pull was cancelled or its disk filled (mid-file, not
    at the file's end)."""

    class Watched(hf_tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            job.check()
            return super().update(n)  # type: ignore[no-any-return]

    return Watched


def picked(siblings: list[Any], include: tuple[str, ...]) -> list[Any]:
    files = [s for s in siblings if not s.rfilename.startswith(".")]
    if include:
        files = [s for s in files if any(fnmatch.fnmatch(s.rfilename, p) for p in include)]
    if len(files) > MAX_FILES:
        raise PullFailed(f"the repository lists {len(files)} files; at most {MAX_FILES}", False)
    return files


def existing(folder: Path) -> int:
    return folder_size(folder) if folder.exists() else 0


def verify(sibling: Any, path: str, job: Job) -> None:
    """The file against its published hash; a mismatch removes it and fails the pull."""
    lfs = getattr(sibling, "lfs", None)
    if lfs is not None and getattr(lfs, "sha256", None):
        want, got = lfs.sha256, file_digest(path, hashlib.sha256())
    elif getattr(sibling, "blob_id", None):
        want, got = sibling.blob_id, git_blob_id(path)
    else:
        return
    if got != want:
        os.unlink(path)
        raise PullFailed(
            f"{sibling.rfilename} does not match the hash the Hub published ({want}, got"
            f" {got}): nothing was kept",
            keep=False,
        )
    job.verified()


def file_digest(path: str, digest: Any, prefix: bytes = b"") -> str:
    digest.update(prefix)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return str(digest.hexdigest())


def git_blob_id(path: str) -> str:
    """Git's object id of the file (what the Hub lists as a non-LFS file's blob id)."""
    size = os.path.getsize(path)
    return file_digest(path, hashlib.sha1(usedforsecurity=False), f"blob {size}\0".encode())
