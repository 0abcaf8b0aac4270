"""Engine environments: each engine family's heavy dependencies (onnxruntime, torch, …) in a
virtualenv of its own under MSHIP_ENGINE_ENVS_DIR (var/engines/<family>/), never in
Modelship's. A family is a pinned requirements file, deployments/engines/requirements/
<family>.txt, or a plugin (`plugin-<name>`: a folder under plugins/, else a distribution
on the package index, with the plugin server's own needs). Its environment is made by
`manage.py engine_env install FAMILY`, or before the first start of a deployment that needs
it; the engine server then runs on its Python.

An environment is ready when its stamp names the hash of its requirements and of the Python
that made it (and a plugin folder's files): a change is a fresh install. An install holds a
file lock (two gateways, two deployments of the family), writes pip's output to
<family>.log next to the environment, and leaves no half environment behind: a failure
removes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
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
PLUGINS_DIR = Path(__file__).resolve().parent.parent / "plugins"
PLUGIN_PREFIX = "plugin-"
PLUGIN_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
# An entry of MSHIP_PLUGINS: a name, and maybe `==version`.
PLUGIN_REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,63})\s*(==\s*[A-Za-z0-9.!+*_-]+)?")
# What every plugin's environment has besides the plugin: the engine server's own needs.
PLUGIN_BASE = ("aiohttp==3.14.5", "numpy==2.4.6", "pillow==13.0.0")
LOG_TAIL_LINES = 15
UNINSTALL = "# modelship-uninstall:"
BUILT = frozenset({"__pycache__", "build", "dist"})  # what pip leaves in a plugin's folder


class EnvFailed(Exception):
    """An environment could not be made; the message ends with pip's last words."""


def families() -> list[str]:
    """The engine families (their requirements files) and the plugins under plugins/."""
    shipped = [path.stem for path in REQUIREMENTS_DIR.glob("*.txt")]
    plugins = [PLUGIN_PREFIX + path.name for path in PLUGINS_DIR.iterdir() if path.is_dir()]
    return sorted(shipped + plugins) if PLUGINS_DIR.is_dir() else sorted(shipped)


def plugin_family(plugin: str) -> str:
    """The environment of a plugin: a folder under plugins/, else a distribution on the
    package index."""
    name = plugin.strip().lower()
    if not PLUGIN_NAME.fullmatch(name):
        raise EnvFailed(f"{plugin!r} is not a plugin name (a folder under plugins/ or a package)")
    return PLUGIN_PREFIX + name


def allowed_plugins() -> dict[str, str]:
    """MSHIP_PLUGINS (the plugins from the package index an administrator allowed) as
    plugin names to the requirement installed for each; an entry that is no requirement
    of that shape is ignored."""
    allowed = {}
    for entry in settings.MSHIP_PLUGINS:
        matched = PLUGIN_REQUIREMENT.fullmatch(entry.strip())
        if matched:
            allowed[matched.group(1).lower()] = re.sub(r"\s+", "", entry)
    return allowed


def requirements(family: str) -> str:
    """What the family's environment installs, as a requirements file's text."""
    path = REQUIREMENTS_DIR / f"{family}.txt"
    if path.is_file():
        return path.read_text()
    if family.startswith(PLUGIN_PREFIX):
        name = family.removeprefix(PLUGIN_PREFIX)
        folder = PLUGINS_DIR / name
        # From the index: the version an administrator allowed, where one did.
        source = str(folder) if folder.is_dir() else allowed_plugins().get(name, name)
        return "\n".join([*PLUGIN_BASE, source]) + "\n"
    raise EnvFailed(f"no engine family {family!r} (known: {', '.join(families())})")


def digest(family: str) -> str:
    """What makes an environment current: its requirements, the Python, and for a plugin
    folder its files (an edited plugin is installed afresh)."""
    content = requirements(family).encode() + sys.version.encode()
    folder = PLUGINS_DIR / family.removeprefix(PLUGIN_PREFIX)
    if family.startswith(PLUGIN_PREFIX) and folder.is_dir():
        for path in sorted(folder.rglob("*")):
            parts = path.relative_to(folder).parts
            if path.is_file() and not any(p in BUILT or p.endswith(".egg-info") for p in parts):
                content += str(path.relative_to(folder)).encode() + path.read_bytes()
    return hashlib.sha256(content).hexdigest()[:16]


def root() -> Path:
    return Path(settings.MSHIP_ENGINE_ENVS_DIR).absolute()  # a container mounts it by path


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
        progress(f"installing the {family} engine environment; pip's output: {log_path(family)}")
        target = location(family)
        shutil.rmtree(target, ignore_errors=True)
        try:
            with log_path(family).open("w") as log:
                run([sys.executable, "-m", "venv", str(target)], log, family)
                wanted = target / "requirements.txt"
                wanted.write_text(with_copied_plugin(family, target))
                pip = [python(family), "-m", "pip", "--disable-pip-version-check"]
                run([*pip, "install", "--upgrade", "pip"], log, family)
                run([*pip, "install", "-r", str(wanted)], log, family)
                unwanted = removed_after_install(family)
                if unwanted:
                    run([*pip, "uninstall", "--yes", *unwanted], log, family)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        stamp(family).touch()
    return python(family)


def removed_after_install(family: str) -> list[str]:
    """What the requirements file's `# modelship-uninstall: a b` lines remove after the
    install: packages a dependency pulls in that break the engine (its comment says why)."""
    names: list[str] = []
    for line in requirements(family).splitlines():
        if line.startswith(UNINSTALL):
            names += line.removeprefix(UNINSTALL).split()
    return names


def with_copied_plugin(family: str, target: Path) -> str:
    """The requirements, a plugin folder installed from a copy in the environment (pip
    builds in place: the folder under plugins/ stays as it is)."""
    text = requirements(family)
    folder = PLUGINS_DIR / family.removeprefix(PLUGIN_PREFIX)
    if not family.startswith(PLUGIN_PREFIX) or not folder.is_dir():
        return text
    copy = target / "plugin-source"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(*BUILT, "*.egg-info"))
    return text.replace(str(folder), str(copy))


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
