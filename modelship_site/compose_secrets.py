"""The passwords compose.yaml's services share, made at the first start (its `secrets`
service runs this before anything else starts) and kept in volumes, never in compose.yaml,
an image or a container's environment.

    python -m modelship_site.compose_secrets ROOT

ROOT/postgres/password   PostgreSQL's password (POSTGRES_PASSWORD_FILE), owned by `--uid`
ROOT/redis/redis.conf    Redis's configuration: `requirepass` and nothing else, owned by `--uid`
ROOT/redis/password      the password itself, owned by `--uid`
ROOT/modelship/database_url, redis_url   the URLs web and cluster read (*_URL_FILE)

Each folder is a volume of its own, mounted only where it is read: Redis never sees the
database's password, PostgreSQL never sees Redis's. A password is made once (a file already
there is kept: the database was initialised with it); the files made from the passwords
are written again on every start. Every file is readable by its owner only; PostgreSQL's and
Redis's official images drop to their own user (uid 999) before they read theirs.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from common.secret_files import create_secret, write_secret

DATABASE = "postgres://modelship:{password}@postgres:5432/modelship"
REDIS = "redis://:{password}@redis:6379/0"
SERVICE_UID = 999  # postgres and redis in their official Debian images


def password(path: Path) -> str:
    """The password at `path`, made now (URL-safe, 256 bits) when there is none yet."""
    create_secret(path, secrets.token_urlsafe(32))
    return path.read_text().strip()


def owned(folder: Path, uid: int) -> None:
    """The folder and its files for the service of that uid alone (root: no change)."""
    if os.geteuid() != 0 or uid == 0:
        return
    for path in [folder, *folder.iterdir()]:
        os.chown(path, uid, uid)
    folder.chmod(0o700)


def make(root: Path, uid: int = SERVICE_UID) -> None:
    postgres, redis, modelship = root / "postgres", root / "redis", root / "modelship"
    database_password = password(postgres / "password")
    redis_password = password(redis / "password")
    write_secret(redis / "redis.conf", f"requirepass {redis_password}")
    write_secret(modelship / "database_url", DATABASE.format(password=database_password))
    write_secret(modelship / "redis_url", REDIS.format(password=redis_password))
    owned(postgres, uid)
    owned(redis, uid)
    modelship.chmod(0o700)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="compose_secrets", description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path, help="where the three secret volumes are mounted")
    parser.add_argument("--uid", type=int, default=SERVICE_UID, help="PostgreSQL's and Redis's")
    options = parser.parse_args(argv)
    make(options.root, options.uid)
    print(f"compose_secrets: the passwords in {options.root} are ready", file=sys.stderr)


if __name__ == "__main__":
    main()
