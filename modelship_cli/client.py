"""The REST API as the command line reaches it: where and with which token (the
environment, the file `modelship login` writes, the var/ of the site it runs in), a warning
before a credential goes over plain http to another host, and errors as exit codes."""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from collections.abc import Iterator

# Exit codes a script can test.
OK, REFUSED, NOT_FOUND, UNREACHABLE = 0, 1, 2, 3


class CliError(Exception):
    def __init__(self, message: str, code: int = REFUSED) -> None:
        super().__init__(message)
        self.code = code


DEFAULT_URL = "http://127.0.0.1:8000"


def config_file() -> Path:
    """Where `modelship login` keeps the site and its token (the user's config directory)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "modelship" / "credentials.json"


def site_var() -> Path | None:
    """The site's var/ (MSHIP_VAR_DIR, else ./var when it holds an admin token: `make run`
    keeps its credentials there). Only the folder it was started in: a var/ of a folder
    above (a shared /tmp, another user's home) is never read, nor its token sent."""
    named = os.environ.get("MSHIP_VAR_DIR")
    if named:
        return Path(named)
    here = Path.cwd() / "var"
    return here if (here / "admin_token").is_file() else None


def read_saved() -> dict[str, str]:
    try:
        saved = json.loads(config_file().read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in saved.items() if isinstance(v, str)} if isinstance(saved, dict) else {}


def write_saved(values: dict[str, str]) -> Path:
    """The credentials file, readable by its owner only (it holds an admin token)."""
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an older file of wider mode
    with os.fdopen(descriptor, "w") as file:
        json.dump(values, file, indent=2)
    return path


@dataclass(frozen=True)
class Found:
    """One credential and where it came from; `tried` says where it was looked for."""

    value: str
    source: str
    tried: tuple[str, ...]


def first_of(env_names: tuple[str, ...], saved: dict[str, str], key: str, var: str) -> Found:
    tried: list[str] = []
    for name in env_names:
        tried.append(name)
        if os.environ.get(name):
            return Found(os.environ[name], name, tuple(tried))
    tried.append(str(config_file()))
    if saved.get(key):
        return Found(saved[key], str(config_file()), tuple(tried))
    folder = site_var()
    tried.append(str((folder or Path.cwd() / "var") / var))
    if folder is not None:
        try:
            value = (folder / var).read_text().strip()
        except OSError:
            value = ""
        if value:
            return Found(value, str(folder / var), tuple(tried))
    return Found("", "", tuple(tried))


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    api_key: str
    token_found: Found | None = None

    @classmethod
    def from_env(cls) -> Config:
        """Each from the first that has it: MODELSHIP_* (or MSHIP_*) variables, the file
        `modelship login` wrote, then the site's var/ when run inside the site."""
        saved = read_saved()
        url = os.environ.get("MODELSHIP_URL") or os.environ.get("MSHIP_URL") or saved.get("url")
        token = first_of(("MODELSHIP_TOKEN", "MSHIP_TOKEN"), saved, "token", "admin_token")
        key = first_of(("MODELSHIP_API_KEY", "MSHIP_API_KEY"), saved, "api_key", "api_key")
        return cls(
            url=(url or DEFAULT_URL).rstrip("/"),
            token=token.value,
            api_key=key.value,
            token_found=token,
        )

    def token_hint(self) -> str:
        """Where the token came from, or everywhere it was looked for."""
        found = self.token_found
        if found is None:
            return ""
        if found.value:
            return f" (the token from {found.source})"
        return f" (no token: tried {', '.join(found.tried)}; `modelship login` saves one)"


# Set (1, true), no warning before a credential goes over plain http to another host.
INSECURE_OK = "MODELSHIP_INSECURE_OK"


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine: localhost, 127.0.0.0/8 or ::1."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def plain_http_warning(url: httpx.URL) -> str:
    """The warning a credential sent to `url` calls for ("" for https or this machine)."""
    if url.scheme != "http" or is_loopback(url.host):
        return ""
    if os.environ.get(INSECURE_OK, "").strip().lower() in ("1", "true", "yes"):
        return ""
    return (
        f"modelship: warning: sending a credential over plain http to {url.host}: anyone on "
        f"the way can read it and use it; use https:// (or set {INSECURE_OK}=1 to go on "
        "without this warning)"
    )


class Api:
    def __init__(
        self,
        config: Config,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.config = config
        self.warned = False
        headers = {"authorization": f"Token {config.token}"} if config.token else {}
        self.http = httpx.Client(
            base_url=config.url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            event_hooks={"request": [self.warn_if_plain]},
        )

    def warn_if_plain(self, request: httpx.Request) -> None:
        """On stderr, once, before the first request whose token or key would go over plain
        http to a host that is not this machine (not refused: a site on a private network
        may be reached so)."""
        if self.warned or "authorization" not in request.headers:
            return
        if message := plain_http_warning(request.url):
            self.warned = True
            print(message, file=sys.stderr, flush=True)

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer, checked: an error answer is a CliError with its exit code."""
        try:
            answer = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(
                f"cannot reach Modelship at {self.config.url}: {exc}", UNREACHABLE
            ) from exc
        check(answer, self.config)
        return answer

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = self.send(method, path, **kwargs)
        return answer.json() if answer.content else None

    def v1_headers(self) -> dict[str, str]:
        """/v1 takes the site's API key (Bearer), not the /api token."""
        return {"authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body)

    def patch(self, path: str, body: Any) -> Any:
        return self.call("PATCH", path, json=body)

    def pages(self, path: str) -> Iterator[dict[str, Any]]:
        page: Any = self.get(path)
        while True:
            yield from page["results"]
            if not page.get("next"):
                return
            page = self.call("GET", page["next"])

    def deployment(self, name: str) -> dict[str, Any]:
        for row in self.pages("/api/deployments/"):
            if row["name"] == name or name in row.get("aliases", []):
                return row
        raise CliError(f"no deployment named {name!r}", NOT_FOUND)

    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[str]:
        """The lines of a streamed answer (server-sent events), as they come."""
        try:
            with self.http.stream(
                method, path, timeout=httpx.Timeout(30, read=None), **kwargs
            ) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    check(answer, self.config)
                yield from answer.iter_lines()
        except httpx.HTTPError as exc:
            raise CliError(
                f"cannot reach Modelship at {self.config.url}: {exc}", UNREACHABLE
            ) from exc


def check(answer: httpx.Response, config: Config) -> None:
    if answer.status_code < 400:
        return
    try:
        body = answer.json()
    except ValueError:
        body = {"detail": answer.text[:200]}
    message = describe(body)
    if answer.status_code in (401, 403):
        raise CliError(f"not allowed: {message}{config.token_hint()}", UNREACHABLE)
    if answer.status_code == 404:
        raise CliError(message, NOT_FOUND)
    raise CliError(message, REFUSED)


def describe(body: Any) -> str:
    """An error answer in one line: /v1's message, or /api's detail and field errors."""
    if not isinstance(body, dict):
        return str(body)
    if isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    parts = [str(body["detail"])] if "detail" in body else []
    for field, value in body.items():
        if field in ("detail", "code"):
            continue
        texts = value if isinstance(value, list) else [value]
        parts.extend(f"{field}: {text}" for text in texts)
    return "; ".join(parts)
