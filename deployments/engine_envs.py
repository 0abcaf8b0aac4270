"""Engine environments: each engine family's heavy dependencies (onnxruntime, torch, …) in a
virtualenv of its own under MSHIP_ENGINE_ENVS_DIR (var/engines/<family>/), never in
Modelship's. A family is a pinned requirements file, deployments/engines/requirements/
<family>.txt. Its environment is made by `manage.py engine_env install FAMILY`, or before the
first start of a deployment that needs it; the engine server then runs on its Python.

An environment is ready when its stamp names the hash of its requirements and of the Python
that made it: a changed requirements file is a fresh install. An install holds a file lock
(two gateways, two deployments of the family), writes pip's output to <family>.log next to
the environment, and leaves no half environment behind: a failure removes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from django.conf import settings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

REQUIREMENTS_DIR = Path(__file__).resolve().parent / "engines" / "requirements"
LOG_TAIL_LINES = 15


class EnvFailed(Exception):
    """An environment could not be made; the message ends with pip's last words."""


def families() -> list[str]:
    return sorted(path.stem for path in REQUIREMENTS_DIR.glob("*.txt"))


def requirements(family: str) -> Path:
    path = REQUIREMENTS_DIR / f"{family}.txt"
    if family not in families():
        raise EnvFailed(f"no engine family {family!r} (known: {', '.join(families())})")
    return path


def digest(family: str) -> str:
    content = requirements(family).read_bytes() + sys.version.encode()
    return hashlib.sha256(content).hexdigest()[:16]


def root() -> Path:
    return Path(settings.MSHIP_ENGINE_ENVS_DIR)


def location(family: str) -> Path:
    return root() / family


def python(family: str) -> str:
    return str(location(family) / "bin" / "python")


def stamp(family: str) -> Path:
    return location(family) / f".ready-{digest(family)}"


def ready(family: str) -> bool:
    return stamp(family).exists()


def log_path(family: str) -> Path:
    return root() / f"{family}.log"


def ensure(family: str, progress: Callable[[str], None] = lambda _: None) -> str:
    """The family's Python, its environment made first where it is not ready (blocking:
    minutes for a large family). `progress` hears what is under way."""
    if ready(family):
        return python(family)
    root().mkdir(parents=True, exist_ok=True)
    with locked(family):
        if ready(family):  # made by whoever held the lock before us
            return python(family)
        progress(
            f"installing the {family} engine environment ({requirements(family).name}); "
            f"pip's output: {log_path(family)}"
        )
        target = location(family)
        shutil.rmtree(target, ignore_errors=True)
        try:
            with log_path(family).open("w") as log:
                run([sys.executable, "-m", "venv", str(target)], log, family)
                pip = [python(family), "-m", "pip", "--disable-pip-version-check"]
                run([*pip, "install", "--upgrade", "pip"], log, family)
                run([*pip, "install", "-r", str(requirements(family))], log, family)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        stamp(family).touch()
    return python(family)


def run(argv: list[str], log: TextIO, family: str) -> None:
    timeout = settings.MSHIP_ENGINE_ENV_TIMEOUT_S
    try:
        done = subprocess.run(
            argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvFailed(failure(family, f"took over {timeout:g} s")) from exc
    if done.returncode != 0:
        raise EnvFailed(failure(family, f"exited with code {done.returncode}"))


def failure(family: str, what: str) -> str:
    lines = log_path(family).read_text(errors="replace").splitlines()
    tail = "\n".join(lines[-LOG_TAIL_LINES:])
    return f"the {family} engine environment could not be installed: pip {what}\n{tail}"


@contextmanager
def locked(family: str) -> Iterator[None]:
    with (root() / f".{family}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
