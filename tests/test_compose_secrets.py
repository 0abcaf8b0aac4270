"""compose.yaml keeps engines away from the database and Redis, and no password in it: the
engines' network is internal and holds only Modelship's own services, PostgreSQL's and
Redis's passwords are made at the first start (modelship_site/compose_secrets.py) and read
from files (DATABASE_URL_FILE, REDIS_URL_FILE, POSTGRES_PASSWORD_FILE, redis.conf)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import yaml
from django.core.exceptions import ImproperlyConfigured

from common.env import env_secret
from modelship_site.compose_secrets import make
from tests.conftest import REPO

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text())
    return loaded


def networks_of(service: dict[str, Any]) -> set[str]:
    return set(service.get("networks") or [])


def mounts_of(service: dict[str, Any]) -> set[str]:
    return {volume.split(":")[0] for volume in service.get("volumes") or []}


def test_it_puts_engines_on_an_internal_network_without_the_database_or_redis(
    compose: dict[str, Any],
) -> None:
    services, networks = compose["services"], compose["networks"]
    engines = networks["engines"]
    # The docker runtime starts engines on the network MSHIP_DOCKER_NETWORK names.
    for name in ("web", "cluster"):
        assert services[name]["environment"]["MSHIP_DOCKER_NETWORK"] == engines["name"]
    assert engines["internal"] is True  # no route out: no metadata endpoint, no Internet
    on_engines = {name for name, s in services.items() if "engines" in networks_of(s)}
    assert on_engines == {"web", "cluster"}  # Modelship itself, which starts and calls them
    # The pulls' cluster downloads: no Docker socket, no GPU.
    assert not any("docker.sock" in v for v in services["pulls"]["volumes"])
    assert not services["pulls"].get("deploy")
    for name in ("postgres", "redis"):
        assert networks_of(services[name]) == {"modelship"}
    assert "internal" not in networks["modelship"]  # web reaches the Hub, `hf download`
    assert services["secrets"]["network_mode"] == "none"


def test_it_writes_no_password_and_reads_each_from_its_own_volume(
    compose: dict[str, Any],
) -> None:
    text = (REPO / "compose.yaml").read_text()
    services = compose["services"]
    for service in services.values():
        env = service.get("environment") or {}
        assert "POSTGRES_PASSWORD" not in env and "DATABASE_URL" not in env
        assert "REDIS_URL" not in env
        for value in env.values():
            assert "@" not in str(value), value  # no URL with credentials
    assert "modelship:modelship@" not in text
    postgres, redis = services["postgres"], services["redis"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/modelship/postgres/password"
    assert redis["command"] == ["redis-server", "/run/modelship/redis/redis.conf"]
    # Each reads its own secret only; the generator runs first, and alone writes them.
    assert mounts_of(postgres) == {"postgres", "secrets-postgres"}
    assert mounts_of(redis) == {"secrets-redis"}
    for name in ("web", "cluster", "pulls"):
        assert "secrets-modelship" in mounts_of(services[name])
        assert not {"secrets-postgres", "secrets-redis"} & mounts_of(services[name])
    for name in ("web", "cluster", "pulls", "postgres", "redis"):
        assert services[name]["depends_on"]["secrets"] == {
            "condition": "service_completed_successfully"
        }
    for volume in services["secrets"]["volumes"]:
        assert not volume.endswith(":ro")


def test_it_makes_the_passwords_once_and_the_files_from_them_on_every_start(
    tmp_path: Path,
) -> None:
    make(tmp_path, uid=999)
    database = (tmp_path / "modelship/database_url").read_text().strip()
    redis = (tmp_path / "modelship/redis_url").read_text().strip()
    password = (tmp_path / "postgres/password").read_text().strip()
    redis_password = (tmp_path / "redis/password").read_text().strip()
    assert len(password) >= 40 and len(redis_password) >= 40 and password != redis_password
    assert urlsplit(database).password == password
    assert urlsplit(database).hostname == "postgres" and urlsplit(database).username == "modelship"
    assert urlsplit(redis).password == redis_password and urlsplit(redis).hostname == "redis"
    conf = (tmp_path / "redis/redis.conf").read_text()
    assert conf == f"requirepass {redis_password}\n"
    for path in tmp_path.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, (path, oct(mode))  # the owner's alone
    if os.geteuid() == 0:
        # PostgreSQL's and Redis's images read theirs as their own user, uid 999.
        for name in ("postgres", "postgres/password", "redis", "redis/redis.conf"):
            assert (tmp_path / name).stat().st_uid == 999, name
        assert (tmp_path / "modelship/database_url").stat().st_uid == 0
    # A second start keeps the passwords the database and Redis were started with.
    (tmp_path / "modelship/redis_url").unlink()
    make(tmp_path, uid=999)
    assert (tmp_path / "postgres/password").read_text().strip() == password
    assert (tmp_path / "modelship/database_url").read_text().strip() == database
    assert (tmp_path / "modelship/redis_url").read_text().strip() == redis
    # Another site gets other passwords.
    make(tmp_path / "other", uid=999)
    assert (tmp_path / "other/postgres/password").read_text().strip() != password


def test_it_reads_a_url_from_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "redis_url"
    secret.write_text("redis://:s3cret@redis:6379/0\n")
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL_FILE", str(secret))
    assert env_secret("REDIS_URL", "") == "redis://:s3cret@redis:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/0")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL and REDIS_URL_FILE are both set"):
        env_secret("REDIS_URL", "")
    monkeypatch.delenv("REDIS_URL")
    monkeypatch.setenv("REDIS_URL_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match=r"REDIS_URL_FILE: .*missing cannot be read"):
        env_secret("REDIS_URL", "")
    monkeypatch.delenv("REDIS_URL_FILE")
    assert env_secret("REDIS_URL", "") == ""


def test_it_takes_the_database_and_redis_urls_from_their_files(tmp_path: Path) -> None:
    (tmp_path / "database_url").write_text("postgres://modelship:pw1@postgres:5432/modelship\n")
    (tmp_path / "redis_url").write_text("redis://:pw2@redis:6379/0\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")} | {
        "DATABASE_URL_FILE": str(tmp_path / "database_url"),
        "REDIS_URL_FILE": str(tmp_path / "redis_url"),
        "MSHIP_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "modelship_site.settings",
    }
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings as s;"
            "d = s.DATABASES['default'];"
            "print(d['HOST'], d['PASSWORD'], s.Q_CLUSTER['redis'])",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.split() == ["postgres", "pw1", "redis://:pw2@redis:6379/0"]
