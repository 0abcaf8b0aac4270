"""The state folder's permissions: var/ readable by its owner only, the SQLite files too.

var/ holds the site's secrets (the secret key, the admin password and token, the on-demand
key, the development API key) and, on the embedded default, the database with every key's
hash and every stored response. A folder made with the usual umask (0755) lets every user of
the host list it and read the database. `serve` and `migrate` call `secure()` before they
touch anything: the folder becomes 0700 and the database 0600, with a warning that says what
was looser, so an operator learns the files were readable by others until now.

The database file is created here (empty, 0600) when it does not exist yet: SQLite gives its
-wal and -shm files the database file's mode, so a database that starts 0600 never has a
readable WAL, not even for the moment before the next check.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600
SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


def secure(var_dir: Path, sqlite_file: Path | None = None) -> list[str]:
    """Tighten var_dir (made when missing) and the SQLite files to the owner; one warning per
    path that was looser, naming its old mode."""
    warnings: list[str] = []
    var_dir.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    warnings += _tighten(var_dir, FOLDER_MODE)
    if sqlite_file is None:
        return warnings
    sqlite_file.parent.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        # O_EXCL: a file another process made in the meantime is left to the check below.
        os.close(os.open(sqlite_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    for suffix in SQLITE_COMPANIONS:
        path = sqlite_file.with_name(sqlite_file.name + suffix)
        if path.exists():
            warnings += _tighten(path, FILE_MODE)
    return warnings


def _tighten(path: Path, mode: int) -> list[str]:
    # lstat: a link planted in var/ is not followed to chmod whatever it points at.
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return [f"{path} is a symbolic link; its permissions were left as they are"]
    current = stat.S_IMODE(info.st_mode)
    if current & ~mode == 0:
        return []
    tight = current & mode
    path.chmod(tight)
    return [f"{path} was readable or writable by others (mode {current:o}); it is now {tight:o}"]


def sqlite_path(database: dict[str, object]) -> Path | None:
    """The database file of a Django DATABASES entry on SQLite, None for any other engine or an
    in-memory database."""
    if database.get("ENGINE") != "django.db.backends.sqlite3":
        return None
    name = str(database.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    return Path(name)
