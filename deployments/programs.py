"""Where engine programs are looked for: the PATH engines run with, which puts the folder of
the Python Modelship runs on first, so an engine installed in Modelship's virtualenv (`pip
install vllm` there) is found without activating it."""

from __future__ import annotations

import os
import shutil
import sys


def search_path(path: str | None = None) -> str:
    """PATH (ours, or the one given) with the folder of Modelship's Python first."""
    own = os.path.dirname(sys.executable)
    given = os.environ.get("PATH", os.defpath) if path is None else path
    return os.pathsep.join([own, *(p for p in given.split(os.pathsep) if p and p != own)])


def find(name: str, setting: str = "") -> str | None:
    """The program a setting names (MSHIP_VLLM_BIN), else `name` on the engines' PATH."""
    return (os.environ.get(setting) if setting else None) or shutil.which(name, path=search_path())
