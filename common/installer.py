"""Making virtualenvs and installing into them: with uv where it runs (seconds where pip
takes minutes), else with pip, chosen once per process and said once. Modelship's own .venv
(the Makefile runs this module before Django is installed: standard library only) and every
engine environment (deployments/engine_envs.py) are made here.

uv reads no pip configuration, so pip's index settings (pip.conf, PIP_* variables: a
mirror, local wheels, a constraint) are passed to it as flags: both install from the same
places. Where an operator configured uv's own indexes (UV_INDEX_URL and kin), uv's stand.
MSHIP_INSTALLER=uv or pip forces one (pip to compare, uv to fail loudly where it is absent).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections import deque
from contextlib import suppress
from functools import cache
from pathlib import Path
from typing import TextIO

# pip's settings uv takes, as uv's flags (a setting may hold several values, space-separated).
PIP_TO_UV = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
# uv's own index settings: where one is set, pip's are not passed.
UV_INDEX_VARIABLES = (
    "UV_INDEX",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
)
CHOICES = ("auto", "uv", "pip")
# The scopes of `pip config list` that apply to an install, the later winning.
PIP_SCOPES = {"global": 0, "install": 1, ":env:": 2}
TAIL_LINES = 15  # of an installer's output, in the error of a failed install


class InstallFailed(Exception):
    """An installer exited with an error or ran too long; the message says which and how."""


def choice() -> str:
    value = os.environ.get("MSHIP_INSTALLER", "").strip() or "auto"
    if value not in CHOICES:
        raise InstallFailed(f"MSHIP_INSTALLER must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


@cache
def uv_binary(python: str = sys.executable) -> str | None:
    """uv beside `python`, beside this Python (Modelship's .venv has it) or on PATH, where
    it runs."""
    beside = [str(Path(path).parent / "uv") for path in (python, sys.executable)]
    for candidate in (*beside, shutil.which("uv")):
        if candidate and os.access(candidate, os.X_OK):
            try:
                done = subprocess.run([candidate, "--version"], capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0:
                return candidate
    return None


@cache
def installer(python: str = sys.executable) -> str:
    """uv or pip for the environment of `python`; a fallback to pip is said once, on
    stderr."""
    wanted = choice()
    if wanted == "pip":
        return "pip"
    if uv_binary(python):
        return "uv"
    if wanted == "uv":
        raise InstallFailed("MSHIP_INSTALLER=uv, but no uv runs here (beside Python or on PATH)")
    say_fallback()
    return "pip"


@cache
def say_fallback() -> None:
    print("modelship: uv does not run here; installing with pip (slower)", file=sys.stderr)


@cache
def pip_settings(python: str) -> dict[str, list[str]]:
    """pip's configured values (files, then PIP_* variables, which win) that uv takes."""
    try:
        listed = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, tuple[int, list[str]]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if name not in PIP_TO_UV or scope not in PIP_SCOPES:
            continue
        rank = PIP_SCOPES[scope]
        if rank >= found.get(name, (-1, []))[0]:
            found[name] = (rank, value.strip().strip("'\"").split())
    return {name: values for name, (_, values) in found.items()}


def uv_index_args(python: str) -> list[str]:
    if any(os.environ.get(name) for name in UV_INDEX_VARIABLES):
        return []
    args: list[str] = []
    settings = pip_settings(python)
    for name, flag in PIP_TO_UV.items():
        for value in settings.get(name, []):
            args += [flag, value]
    if settings.get("extra-index-url") or settings.get("find-links"):
        # pip takes the best version over every index; uv's default stops at the first.
        args += ["--index-strategy", "unsafe-best-match"]
    return args


def run(argv: list[str], log: TextIO, timeout: float, cwd: str | None = None) -> None:
    """Run an installer (in `cwd`), its output copied to `log` and its last lines kept here:
    a failure says them even where the log cannot be written (a full disk)."""
    name = Path(argv[0]).name
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with suppress(OSError):
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
    try:
        child = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            cwd=cwd,
        )
    except OSError as exc:
        raise InstallFailed(f"{argv[0]} could not run: {exc.strerror}") from exc
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        child.kill()

    timer = threading.Timer(timeout, expire)
    timer.start()
    try:
        assert child.stdout is not None
        for line in child.stdout:
            tail.append(line.rstrip("\n"))
            with suppress(OSError):
                log.write(line)
        code = child.wait()
    finally:
        timer.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
    words = "\n".join(tail)
    if expired.is_set():
        raise InstallFailed(f"{name} took over {timeout:g} s\n{words}")
    if code != 0:
        raise InstallFailed(f"{name} exited with code {code}\n{words}")


def make_venv(target: Path, log: TextIO, timeout: float) -> None:
    """A fresh virtualenv at `target` on this Python's base interpreter, with pip in it
    (the fallback, and what some engines' tools expect)."""
    if installer() == "uv":
        uv = uv_binary() or "uv"
        argv = [uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(target)]
        run(argv, log, timeout)
    else:
        run([sys.executable, "-m", "venv", str(target)], log, timeout)


def install(
    python: str, args: list[str], log: TextIO, timeout: float, compiled: bool = False
) -> None:
    """`pip install ARGS` into the environment of `python`, by uv or pip. `compiled`: its
    modules byte-compiled as they are installed, as pip does and uv does not by default (an
    engine's environment: a vLLM start otherwise compiles torch's and vLLM's sources, tens
    of seconds of CPU, at every start where Python may not write its caches)."""
    if installer(python) == "uv":
        uv = uv_binary(python) or "uv"
        index = uv_index_args(python)
        extra = ["--compile-bytecode"] if compiled else []
        run([uv, "pip", "install", "--python", python, *index, *extra, *args], log, timeout)
    else:
        run([python, "-m", "pip", "--disable-pip-version-check", "install", *args], log, timeout)


def download(
    python: str, args: list[str], log: TextIO, timeout: float, cwd: str | None = None
) -> None:
    """`pip download ARGS` with the pip of `python`'s environment (uv downloads nothing
    without installing it), from pip's configured indexes, run in `cwd` (an empty folder:
    pip reads a requirement that names a file there as that file)."""
    argv = [python, "-m", "pip", "--disable-pip-version-check", "download", *args]
    run(argv, log, timeout, cwd)


def uninstall(python: str, names: list[str], log: TextIO, timeout: float) -> None:
    if installer(python) == "uv":
        uv = uv_binary(python) or "uv"
        run([uv, "pip", "uninstall", "--python", python, *names], log, timeout)
    else:
        pip = [python, "-m", "pip", "--disable-pip-version-check", "uninstall", "--yes"]
        run([*pip, *names], log, timeout)


def bootstrap(venv: Path, lock: str, log: TextIO) -> None:
    """Modelship's own .venv (make setup): made with venv, uv put in it by pip from the
    lock file, then everything else by uv."""
    python = venv / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)], log, 600)
    if choice() != "pip" and not (venv / "bin" / "uv").exists():
        try:
            run([str(python), "-m", "pip", "install", "--quiet", "-c", lock, "uv"], log, 600)
        except InstallFailed as exc:
            if choice() == "uv":
                raise
            print(f"modelship: uv could not be installed ({exc}); using pip", file=sys.stderr)


def main(argv: list[str]) -> int:
    """python -m common.installer VENV LOCK REQUIREMENT...: make VENV (if needed) and install
    the requirements into it, constrained by LOCK."""
    if len(argv) < 3:
        print("usage: python -m common.installer VENV LOCK REQUIREMENT...", file=sys.stderr)
        return 2
    venv, lock, wanted = Path(argv[0]), argv[1], argv[2:]
    try:
        bootstrap(venv, lock, sys.stderr)
        install(str(venv / "bin" / "python"), ["--quiet", "-c", lock, *wanted], sys.stderr, 1800)
    except InstallFailed as exc:
        print(f"modelship: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
