"""The site's state folder and database file, secured by the commands that start Modelship
(`serve`, `migrate`): common/var_dir.py does the work, this names the site's paths."""

from __future__ import annotations

from django.conf import settings

from common.var_dir import secure, sqlite_path


def secure_var() -> list[str]:
    """var/ 0700 and the default database's files 0600; a warning for each that was looser."""
    return secure(settings.VAR_DIR, sqlite_path(settings.DATABASES["default"]))
