"""The processes of Modelship's container image (the Dockerfile's command; compose.yaml runs
one of each): `web`, migrations and then `serve` on 0.0.0.0:8000 without a cluster of its
own; `cluster`, the django-q cluster that runs starts, stops and the reaper; `pulls`, the
model store's pulls' own cluster (a download never holds the others' workers).

Run: ``python -m modelship_site.container web|cluster``
"""

from __future__ import annotations

import os
import sys

ROLES = {
    "web": ["manage.py", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-cluster"],
    "cluster": ["manage.py", "qcluster"],
    "pulls": ["manage.py", "qcluster"],  # the model store's pulls' own cluster
}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    role = args[0] if args else "web"
    if role not in ROLES:
        raise SystemExit(f"usage: python -m modelship_site.container {'|'.join(ROLES)}")
    if role == "web":
        # The state folder (SQLite, keys, engine environments), made on a first start.
        os.makedirs(os.environ.get("MSHIP_VAR_DIR", "var"), exist_ok=True)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
        import django  # noqa: PLC0415 - settings are read only once the role is known
        from django.core.management import call_command  # noqa: PLC0415

        django.setup()
        call_command("migrate", "--noinput")
    if role == "pulls":  # django-q reads the cluster it runs from Q_CLUSTER_NAME
        os.environ["Q_CLUSTER_NAME"] = f"{os.environ.get('MSHIP_Q_NAME', 'modelship')}-pulls"
    os.execv(sys.executable, [sys.executable, *ROLES[role], *args[1:]])


if __name__ == "__main__":
    main()
