"""manage.py migrate, with the state folder secured first (common/var_dir.py).

The first migrate of the embedded default makes var/ and the SQLite database, so this is where
they get their modes: var/ 0700, the database (and so its WAL) 0600.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import migrate

from modelship_site.var_check import secure_var


class Command(migrate.Command):
    def execute(self, *args: Any, **options: Any) -> str | None:
        # execute, not handle: the system checks before handle open the database (creating it).
        for warning in secure_var():
            self.stderr.write(f"warning: {warning}")
        result: str | None = super().execute(*args, **options)
        return result
