"""A Docker Engine and a locally built engine image for the docker runtime's tests.

No registry is reachable, so the image is `docker import`ed from a skeleton root file system
made here; the host's /usr, this Python and the project are bind-mounted into it read-only,
so the container runs the project's own simulated engine. The skeleton is deterministic, and
the image is tagged with its hash: built once, reused by every later run.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import uuid
from typing import TYPE_CHECKING, Any

import docker
import pytest

from tests.conftest import REPO

if TYPE_CHECKING:
    from collections.abc import Iterator

# /sbin is a folder of its own: Docker mounts its init process at /sbin/docker-init, which
# cannot be made inside the read-only /usr.
DIRS = ("usr", "etc", "tmp", "proc", "sys", "dev", "root", "run", "var", "sbin")
LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64"}


def skeleton() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in DIRS:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name, target in LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mtime = len(passwd), 0
        tar.addfile(info, io.BytesIO(passwd))
    return out.getvalue()


def engine_volumes() -> list[str]:
    """The host paths the engine needs, read-only at the same paths: /usr with the
    alternatives its links point into (Debian's libblas.so.3 for ffmpeg, for one)."""
    paths = {"/usr", "/etc/alternatives", sys.base_prefix, sys.prefix, str(REPO)}
    return [f"{p}:{p}:ro" for p in sorted(paths)]


@pytest.fixture(scope="session")
def docker_client() -> Any:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker Engine answers ({exc}); `make test` starts one")
    return client


@pytest.fixture(scope="session")
def engine_image(docker_client: Any) -> str:
    data = skeleton()
    tag = f"modelship-test-engine:{hashlib.sha256(data).hexdigest()[:12]}"
    try:
        docker_client.images.get(tag)
    except docker.errors.ImageNotFound:
        subprocess.run(["docker", "import", "-", tag], input=data, check=True, capture_output=True)
    return tag


@pytest.fixture
def docker_site(site: Any, engine_image: str, docker_client: Any) -> Iterator[Any]:
    """A site of its own on the daemon for each test; its containers are removed after."""
    site.MSHIP_SITE = f"mstest-{uuid.uuid4().hex[:8]}"
    site.MSHIP_DOCKER_NETWORK = "modelship-test"
    site.MSHIP_CONTAINER_PYTHON = sys.executable
    site.MSHIP_ENGINE_IMAGE = engine_image
    yield site
    for container in docker_client.containers.list(
        all=True, filters={"label": f"modelship.site={site.MSHIP_SITE}"}
    ):
        container.remove(force=True)


def docker_block(**extra: Any) -> dict[str, Any]:
    return {"volumes": engine_volumes(), "working_dir": str(REPO), **extra}
