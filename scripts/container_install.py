"""The Dockerfile's install step: Modelship's dependencies (pyproject.toml's) in the virtualenv
/opt/modelship, made unless the base image holds one already, and on a Debian base the
system packages its engines use. The project itself runs from its source folder.

A base that already has every dependency installed (the test suite's, imported from this
host: no registry or index is reachable there) needs no package index at all.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

VENV = Path("/opt/modelship")
SYSTEM_PACKAGES = ("espeak-ng", "ffmpeg")


def main() -> None:
    if not (VENV / "bin" / "python").exists():
        venv.create(VENV, with_pip=True)
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir"]
    subprocess.run([*pip, *project["dependencies"]], check=True)
    apt = shutil.which("apt-get")
    if apt and not all(shutil.which(name) for name in ("espeak-ng", "ffmpeg")):
        subprocess.run([apt, "update", "-qq"], check=True)
        subprocess.run(
            [apt, "install", "-y", "-qq", "--no-install-recommends", *SYSTEM_PACKAGES], check=True
        )
        shutil.rmtree("/var/lib/apt/lists", ignore_errors=True)
    print(f"installed into {VENV} for Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
