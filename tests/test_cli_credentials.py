"""Where `modelship` takes its token from, and where it sends it: ./var of the folder it was
started in (never a folder above), a token file or the environment (never the command
line, which `ps` shows every user of the host), and a warning before a credential goes over
plain http to a host that is not this machine."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
from typing import TYPE_CHECKING, Any

import httpx

from deployments.runtimes.process import free_port
from modelship_cli.client import INSECURE_OK, Api, Config
from tests.conftest import REPO
from tests.local_http import local_http

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

CREDENTIAL_VARIABLES = (
    "MODELSHIP_URL",
    "MSHIP_URL",
    "MODELSHIP_TOKEN",
    "MSHIP_TOKEN",
    "MODELSHIP_API_KEY",
    "MSHIP_API_KEY",
    "MSHIP_VAR_DIR",
    INSECURE_OK,
)


def cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`modelship ARGS` with none of this environment's credentials, its config under
    tmp_path, stdin empty."""
    clean = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARIABLES}
    return subprocess.run(
        [str(REPO / ".venv/bin/modelship"), *args],
        env={**clean, "XDG_CONFIG_HOME": str(tmp_path / "config"), "COLUMNS": "160", **env},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


class Site(http.server.BaseHTTPRequestHandler):
    """/api/host, answered for the one token it takes."""

    TOKEN = "the-right-token"
    seen: list[str] = []

    def do_GET(self) -> None:
        offered = self.headers.get("authorization", "")
        Site.seen.append(offered)
        status = 200 if offered == f"Token {self.TOKEN}" else 401
        body = b"{}" if status == 200 else b'{"detail": "Invalid token."}'
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_it_reads_the_sites_token_only_in_the_folder_it_was_started_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    site = tmp_path / "site"
    (site / "var").mkdir(parents=True)
    (site / "var" / "admin_token").write_text("the-sites-token\n")
    below = site / "deep" / "below"
    below.mkdir(parents=True)

    monkeypatch.chdir(below)  # a var/ of a folder above is not read
    lost = Config.from_env()
    assert lost.token == ""
    assert lost.token_found is not None
    assert str(below / "var" / "admin_token") in lost.token_found.tried
    monkeypatch.chdir(site)
    assert Config.from_env().token == "the-sites-token"


def test_it_refuses_a_token_on_the_command_line(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    refused = cli(tmp_path, "login", nowhere, "--token", "a-secret")
    assert refused.returncode == 1, refused.stderr
    assert "--token is refused" in refused.stderr and "ps" in refused.stderr
    assert "--token-file PATH or MODELSHIP_TOKEN" in refused.stderr
    assert "a-secret" not in refused.stderr
    keyed = cli(tmp_path, "login", nowhere, "--api-key", "msk-secret")
    assert keyed.returncode == 1 and "--api-key is refused" in keyed.stderr
    assert "--api-key-file PATH or MODELSHIP_API_KEY" in keyed.stderr
    assert not (tmp_path / "config").exists()


def test_it_logs_in_with_a_token_from_a_file_or_the_environment(tmp_path: Path) -> None:
    saved = tmp_path / "config" / "modelship" / "credentials.json"
    token_file = tmp_path / "token"
    Site.seen.clear()
    with local_http(Site) as url:
        token_file.write_text("wrong\n")
        wrong = cli(tmp_path, "login", url, "--token-file", str(token_file))
        assert wrong.returncode == 3 and "not allowed" in wrong.stderr
        assert not saved.exists()
        token_file.write_text(Site.TOKEN + "\n")
        logged = cli(tmp_path, "login", url, "--token-file", str(token_file))
        assert logged.returncode == 0, logged.stderr
        assert json.loads(saved.read_text()) == {"url": url, "token": Site.TOKEN}
        saved.unlink()
        named = cli(tmp_path, "login", url, MODELSHIP_TOKEN=Site.TOKEN)
        assert named.returncode == 0, named.stderr
        assert json.loads(saved.read_text()) == {"url": url, "token": Site.TOKEN}
        absent = cli(tmp_path, "login", url, "--token-file", str(tmp_path / "absent"))
        assert absent.returncode == 2 and "cannot read the token file" in absent.stderr
        key_file = tmp_path / "key"
        key_file.write_text("msk-kept\n")
        keyed = cli(
            tmp_path, "login", url, "--api-key-file", str(key_file), MODELSHIP_TOKEN=Site.TOKEN
        )
        assert keyed.returncode == 0, keyed.stderr
        assert json.loads(saved.read_text())["api_key"] == "msk-kept"
    assert Site.seen == [f"Token {t}" for t in ("wrong", Site.TOKEN, Site.TOKEN, Site.TOKEN)]
    assert "warning" not in logged.stderr + named.stderr  # 127.0.0.1: this machine


def test_it_warns_before_a_credential_goes_over_plain_http_to_another_host(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Said once on stderr, before the request; the request still goes (a site on a private
    network may be reached so). No real host is asked: the answers are a mock's."""
    monkeypatch.delenv(INSECURE_OK, raising=False)
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(200, json={})

    def said(url: str, token: str = "t", api_key: str = "") -> str:
        api = Api(
            Config(url=url, token=token, api_key=api_key), transport=httpx.MockTransport(answer)
        )
        api.get("/api/host")
        api.call("GET", "/v1/models", headers=api.v1_headers())
        return capsys.readouterr().err

    warned = said("http://10.1.2.3:8000")
    assert warned.count("warning: sending a credential over plain http to 10.1.2.3") == 1
    assert INSECURE_OK in warned and asked[-2:] == [
        "http://10.1.2.3:8000/api/host",
        "http://10.1.2.3:8000/v1/models",
    ]
    assert "over plain http to 192.0.2.1" in said("http://192.0.2.1:8000", "", api_key="k")
    for here in (
        "http://127.0.0.1:8000",
        "http://127.0.0.2:8000",
        "http://[::1]:8000",
        "http://localhost:8000",
        "https://10.1.2.3:8000",
    ):
        assert said(here) == "", here
    assert said("http://10.1.2.3:8000", token="") == ""  # no credential, nothing to warn of
    monkeypatch.setenv(INSECURE_OK, "1")
    assert said("http://10.1.2.3:8000") == ""
