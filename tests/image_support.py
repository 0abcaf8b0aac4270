"""A base image for Modelship's Dockerfile, imported from this host (no registry is reachable
here): this Python, the system libraries it and the installed packages link to, and a
virtualenv at /opt/modelship holding Modelship's runtime dependencies (the packages its
pyproject.toml requires, and theirs) with pip, so the Dockerfile's install step finds every
requirement satisfied and needs no index. Tagged with a hash of what it holds: built once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.requirements import Requirement

from tests.conftest import REPO
from tests.docker_support import DIRS, LINKS

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

VENV = "opt/modelship"
TOOLS = ("pip", "setuptools")  # the Dockerfile's install step runs pip
SKIPPED_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "site-packages"}
LIBRARY = re.compile(r"(?:=>\s*)?(/\S+\.so[\w.]*)")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_distributions() -> list[importlib.metadata.Distribution]:
    """The installed distributions Modelship needs to run: its dependencies, with the extras
    they ask for, and theirs."""
    installed = {normalise(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pending = [Requirement(r) for r in [*project["dependencies"], *TOOLS]]
    seen: dict[str, set[str]] = {}
    while pending:
        requirement = pending.pop()
        name = normalise(requirement.name)
        extras = set(requirement.extras)
        if name not in installed or (name in seen and extras <= seen[name]):
            continue
        seen[name] = seen.get(name, set()) | extras
        for text in installed[name].requires or []:
            needed = Requirement(text)
            wanted = [{"extra": e} for e in seen[name]] or [{"extra": ""}]
            if needed.marker is None or any(needed.marker.evaluate(env) for env in wanted):
                pending.append(needed)
    return [installed[name] for name in sorted(seen)]


def venv_files(distributions: Iterable[importlib.metadata.Distribution]) -> Iterator[Path]:
    prefix = Path(sys.prefix)
    yield prefix / "pyvenv.cfg"
    yield from sorted((prefix / "bin").glob("python*"))
    for dist in distributions:
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_relative_to(prefix.resolve()) and path.exists():
                yield path


def python_files() -> Iterator[Path]:
    base = Path(sys.base_prefix)
    yield from sorted((base / "bin").glob("python3*"))
    yield from sorted((base / "lib").glob("libpython3*"))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for top, folders, names in os.walk(stdlib):
        folders[:] = [f for f in folders if f not in SKIPPED_STDLIB and f != "__pycache__"]
        yield from (Path(top) / name for name in names)


def linked_libraries(files: Iterable[Path]) -> set[Path]:
    """The system libraries the executables and extension modules link to (ldd)."""
    binaries = [
        str(f)
        for f in files
        if f.suffix == ".so" or ".so." in f.name or f.name.startswith("python3")
    ]
    found: set[Path] = set()
    for start in range(0, len(binaries), 200):
        listing = subprocess.run(
            ["ldd", *binaries[start : start + 200]], capture_output=True, text=True, check=False
        ).stdout
        found |= {Path(match) for match in LIBRARY.findall(listing)}
    own = (Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())
    return {p for p in found if p.exists() and not any(p.resolve().is_relative_to(o) for o in own)}


def archive_name(path: Path) -> str:
    """Where a host path goes in the image: the venv at /opt/modelship, the rest as is (the
    skeleton's /lib and /lib64 are links into /usr)."""
    prefix = Path(sys.prefix)
    if path.is_relative_to(prefix):
        return f"{VENV}/{path.relative_to(prefix)}"
    name = str(path).lstrip("/")
    for link, target in LINKS.items():
        if name.startswith(link + "/"):
            return target + name[len(link) :]
    return name


def base_tag(distributions: list[importlib.metadata.Distribution]) -> str:
    held = "\n".join(f"{d.metadata['Name']}=={d.version}" for d in distributions)
    key = f"{sys.version}\n{sys.base_prefix}\n{held}".encode()
    return f"modelship-test-base:{hashlib.sha256(key).hexdigest()[:12]}"


def write_base(tar: tarfile.TarFile, distributions: list[importlib.metadata.Distribution]) -> None:
    for name in (*DIRS, "opt", "srv", "usr/local", "usr/local/bin", "var/lib"):
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
        tar.addfile(info)
    for name, target in {
        **LINKS,
        "usr/local/bin/python3": f"{sys.base_prefix}/bin/python3",
    }.items():
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        tar.addfile(info)
    python = list(python_files())
    venv = list(venv_files(distributions))
    libraries = linked_libraries([*python, *venv])
    for library in sorted(libraries):
        # The name it is linked by, and the file behind it.
        tar.add(library.resolve(), archive_name(library.resolve()), recursive=False)
        if library.is_symlink():
            tar.add(library, archive_name(library), recursive=False)
    added: set[str] = set()
    for path in [*python, *venv]:
        name = archive_name(path)
        if name not in added:
            added.add(name)
            tar.add(path, name, recursive=False)


def ensure_base_image(client: object) -> str:
    """The base image's tag, imported unless the daemon has it."""
    import docker  # noqa: PLC0415 - only the image tests need it

    distributions = runtime_distributions()
    tag = base_tag(distributions)
    try:
        client.images.get(tag)  # type: ignore[attr-defined]
        return tag
    except docker.errors.ImageNotFound:
        pass
    importer = subprocess.Popen(["docker", "import", "-", tag], stdin=subprocess.PIPE)
    assert importer.stdin is not None
    with tarfile.open(fileobj=importer.stdin, mode="w|") as tar:
        write_base(tar, distributions)
    importer.stdin.close()
    if importer.wait() != 0:
        raise RuntimeError(f"docker import of {tag} failed")
    return tag
