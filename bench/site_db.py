"""The migrated SQLite database a bench site starts from, made once by bench/run_all.py.

Each script sets up a site of its own in a temporary folder, and migrating its fresh
database took a Django start-up and about half a second of CPU each time. run_all migrates
one template first and names it in MSHIP_BENCH_DB_TEMPLATE; a script copies it where its
site's database goes, and migrates only when run on its own (no template named, or none
there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = "MSHIP_BENCH_DB_TEMPLATE"

# What a site's set-up script runs first where there was no template to copy.
MIGRATE_HERE = (
    "from django.core.management import call_command; call_command('migrate', verbosity=0)\n"
)
# The last connection's close folds the write-ahead log into the file (checkpointed first
# all the same): the template is then one file that can be copied as it is.
MIGRATE = (
    "import django; django.setup()\n"
    f"{MIGRATE_HERE}"
    "from django.db import connection\n"
    "with connection.cursor() as cursor: cursor.execute('PRAGMA wal_checkpoint(TRUNCATE)')\n"
    "connection.close()\n"
)


def make(path: Path, env: dict[str, str]) -> None:
    """Migrate a new SQLite database at `path`, in a process of its own with the scripts'
    environment `env` (the caller's Django, if any, serves another site); its folder is that
    site's."""
    env = {
        **env,
        "DATABASE_URL": f"sqlite:///{path}",
        "MSHIP_VAR_DIR": str(path.parent),
        "DJANGO_SETTINGS_MODULE": "modelship_site.settings",
    }
    subprocess.run([sys.executable, "-c", MIGRATE], env=env, cwd=REPO, check=True)


def copy_to(database: Path) -> bool:
    """Put the template at `database` (a site's SQLite file, not there yet): whether there
    was one (if not, the caller migrates)."""
    template = os.environ.get(TEMPLATE)
    if not template or not Path(template).is_file():
        return False
    shutil.copyfile(template, database)
    return True
