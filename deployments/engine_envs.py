"""Engine environments: each engine family's heavy dependencies (onnxruntime, torch, …) in a
virtualenv of its own, never in Modelship's. A family is a pinned requirements file,
deployments/engines/requirements/<family>.txt, or a plugin (`plugin-<name>`: a folder under
plugins/, else a distribution on the package index, with the plugin server's own needs). Its
environment is made by `manage.py engine_env install FAMILY`, or before the first start of a
deployment that needs it; the engine server then runs on its Python.

An environment is addressed by what it installs: MSHIP_ENGINE_ENVS_DIR/<family>-<digest>/,
the digest of its requirements, of the Python that made it (and of a plugin folder's files).
The folder is a machine-wide cache (by default under the user's cache directory): a second
clone, a second site and CI's fresh clone reuse an environment instead of installing it
again, and a changed requirements file is a fresh folder beside the old one (`engine_env
prune` removes those no requirements file names).

An environment is ready when its stamp is there and it is intact: its Python runs from where
it was made and every file the install wrote is still there at its size (a killed install,
a removed interpreter or a deleted file is installed afresh, never used). An install holds a
file lock (two clones, two gateways, two deployments of the family: one installs, the rest
wait and use it), writes the installer's output to <family>-<digest>.log next to the
environment, and leaves no half environment behind: a failure removes it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import sys
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from django.conf import settings

from common import installer

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
UNINSTALL = "# modelship-uninstall:"
BUILT = frozenset({"__pycache__", "build", "dist"})  # what pip leaves in a plugin's folder
READY = ".ready"  # the stamp: written last, when the install has finished
MANIFEST = ".manifest"  # every file the install wrote, with its size
LAST_USED = ".last-used"


class EnvFailed(Exception):
    """An environment could not be made; the message ends with the installer's last words."""


def families() -> list[str]:
    """The engine families (their requirements files) and the plugins under plugins/."""
    shipped = [path.stem for path in REQUIREMENTS_DIR.glob("*.txt")]
    folders = PLUGINS_DIR.iterdir() if PLUGINS_DIR.is_dir() else ()
    return sorted(shipped + [PLUGIN_PREFIX + path.name for path in folders if path.is_dir()])


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
    """What makes an environment current: its requirements, the Python (its version and
    where it lies), and for a plugin folder its files (an edited plugin is installed
    afresh), not where the checkout lies: the environment installs a copy of the folder, so
    every clone of one checkout shares it."""
    text = requirements(family)
    folder = PLUGINS_DIR / family.removeprefix(PLUGIN_PREFIX)
    plugin_folder = family.startswith(PLUGIN_PREFIX) and folder.is_dir()
    if plugin_folder:
        text = text.replace(str(folder), f"plugins/{folder.name}")
    content = text.encode() + sys.version.encode() + sys.base_prefix.encode()
    if plugin_folder:
        for path in sorted(folder.rglob("*")):
            parts = path.relative_to(folder).parts
            if path.is_file() and not any(p in BUILT or p.endswith(".egg-info") for p in parts):
                data = path.read_bytes()  # with its name and length: no two folders alike
                name = str(path.relative_to(folder)).encode()
                content += name + b"\0" + len(data).to_bytes(8, "big") + data
    return hashlib.sha256(content).hexdigest()[:16]


def root() -> Path:
    return Path(settings.MSHIP_ENGINE_ENVS_DIR).expanduser().absolute()  # mounted by path


def location(family: str) -> Path:
    return root() / f"{family}-{digest(family)}"


def python(family: str) -> str:
    return str(location(family) / "bin" / "python")


def ready(family: str) -> bool:
    return damage(location(family)) is None


def damage(target: Path) -> str | None:
    """Why the environment at `target` cannot be used (None: it can): not made (or not to
    the end), its interpreter gone, or a file of its install missing or changed in size."""
    if not (target / READY).exists():
        return "not installed" if not target.exists() else "not installed to the end"
    if not (target / "bin" / "python").resolve().is_file():
        return "its Python is gone (the interpreter it was made with was removed)"
    try:
        listed = (target / MANIFEST).read_text().splitlines()
    except OSError:
        return "its list of files is gone"
    for line in listed:
        size, _, name = line.partition("\t")
        try:
            if (target / name).lstat().st_size != int(size):
                return f"{name} has changed"
        except OSError:
            return f"{name} is missing"
    return None


def manifest(target: Path) -> str:
    """Every file the install wrote, with its size (bytecode left out: Python writes it)."""
    lines = []
    for path in sorted(target.rglob("*")):
        if "__pycache__" in path.parts or (path.is_dir() and not path.is_symlink()):
            continue
        name = str(path.relative_to(target))
        if "\t" not in name and "\n" not in name:
            lines.append(f"{path.lstat().st_size}\t{name}")
    return "\n".join(lines) + "\n"


def log_path(family: str) -> Path:
    return log_of(location(family))


def log_of(target: Path) -> Path:
    """The installer's output, beside the environment."""
    return target.with_name(target.name + ".log")


def ensure(family: str, progress: Callable[[str], None] = lambda _: None) -> str:
    """The family's Python, its environment made first where it is not ready (blocking:
    minutes for a large family). `progress` hears what is under way."""
    target = location(family)
    if damage(target) is None:
        mark_used(target)
        return python(family)
    root().mkdir(parents=True, exist_ok=True)
    waiting = f"waiting for the {family} engine environment: another install of it is under way"
    with locked(target, lambda: progress(waiting)):
        why = damage(target)
        if why is None:  # made by whoever held the lock before us
            mark_used(target)
            return python(family)
        if why != "not installed":
            progress(f"the {family} engine environment is damaged ({why}): installing it afresh")
        try:
            tool = installer.installer()
        except installer.InstallFailed as exc:
            raise EnvFailed(f"the {family} engine environment cannot be installed: {exc}") from exc
        progress(f"installing the {family} engine environment with {tool}: {log_path(family)}")
        shutil.rmtree(target, ignore_errors=True)
        try:
            with open_log(family) as log:
                build(family, target, log)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
    mark_used(target)
    return python(family)


def build(family: str, target: Path, log: TextIO) -> None:
    """Make the environment; the stamp last, so that it is there only for a whole one."""
    timeout = settings.MSHIP_ENGINE_ENV_TIMEOUT_S
    try:
        installer.make_venv(target, log, timeout)
        wanted = target / "requirements.txt"
        wanted.write_text(with_copied_plugin(family, target))
        installer.install(python(family), ["-r", str(wanted)], log, timeout, compiled=True)
        unwanted = removed_after_install(family)
        if unwanted:
            installer.uninstall(python(family), unwanted, log, timeout)
        (target / MANIFEST).write_text(manifest(target))
        (target / READY).write_text(f"{family} {digest(family)} {sys.version}\n")
    except (installer.InstallFailed, OSError) as exc:
        raise EnvFailed(f"the {family} engine environment could not be installed: {exc}") from exc


def open_log(family: str) -> TextIO:
    """The install's log, next to the environment (nowhere where it cannot be made: the
    error still has the installer's last words)."""
    try:
        return log_path(family).open("w")
    except OSError:
        return open(os.devnull, "w")  # the caller closes it


def mark_used(target: Path) -> None:
    """When it was last used, for `engine_env list` and `prune --unused-days`."""
    with suppress(OSError):  # a read-only cache (a container's mount) is still usable
        (target / LAST_USED).touch()


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


@contextmanager
def locked(target: Path, waiting: Callable[[], None] = lambda: None) -> Iterator[None]:
    """The install lock of an environment; `waiting` hears when another holds it first."""
    with lock_path(target).open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


def cached() -> list[Path]:
    """Every environment in the cache, named by a family of this checkout or not (another
    clone's, an older requirements file's, the layout before content addressing)."""
    if not root().is_dir():
        return []
    return sorted(path for path in root().iterdir() if (path / "pyvenv.cfg").exists())


def named() -> dict[Path, str]:
    """The environments this checkout's families name, to their family."""
    return {location(family): family for family in families()}


def size_of(target: Path) -> int:
    total = 0
    for path in target.rglob("*"):
        with suppress(OSError):
            total += path.lstat().st_size
    return total


def last_used(target: Path) -> float | None:
    for name in (LAST_USED, READY):
        with suppress(OSError):
            return (target / name).stat().st_mtime
    return None


def remove(target: Path) -> bool:
    """Remove a cached environment unless an install of it is under way (its lock is held);
    True when it went."""
    with lock_path(target).open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            shutil.rmtree(target, ignore_errors=True)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    lock_path(target).unlink(missing_ok=True)
    log_of(target).unlink(missing_ok=True)
    return True
