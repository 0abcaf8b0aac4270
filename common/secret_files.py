"""Files that hold a secret: created readable by their owner only, in one step.

Written with O_EXCL and mode 0600 at creation, so no other user can open the file in the
moment between its creation and a chmod, and a file (or link) planted at the path beforehand
is never written through: the secret goes to a new file that then takes the path's place.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def write_secret(path: Path, text: str) -> None:
    """Put `text` (plus a newline) at `path`, readable and writable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text.rstrip("\n") + "\n")
        os.replace(fresh, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fresh.unlink()
        raise


def create_secret(path: Path, text: str) -> bool:
    """Like write_secret, but only where nothing is at `path` yet; True when it was made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text.rstrip("\n") + "\n")
    return True
