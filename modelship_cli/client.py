"""The REST API as the command line reaches it: where (MSHIP_URL), with which token
(MSHIP_TOKEN, else the admin token `make run` keeps in var/), and errors as exit codes."""

from __future__ import annotations

import os
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


def var_dir() -> Path:
    return Path(os.environ.get("MSHIP_VAR_DIR", "var"))


def saved(name: str) -> str:
    try:
        return (var_dir() / name).read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    api_key: str

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            url=os.environ.get("MSHIP_URL", "http://127.0.0.1:8000").rstrip("/"),
            token=os.environ.get("MSHIP_TOKEN") or saved("admin_token"),
            api_key=os.environ.get("MSHIP_API_KEY") or saved("api_key"),
        )


class Api:
    def __init__(self, config: Config, timeout: float = 30.0) -> None:
        self.config = config
        headers = {"authorization": f"Token {config.token}"} if config.token else {}
        self.http = httpx.Client(base_url=config.url, headers=headers, timeout=timeout)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            answer = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(
                f"cannot reach Modelship at {self.config.url}: {exc}", UNREACHABLE
            ) from exc
        check(answer, self.config)
        return answer.json() if answer.content else None

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
        hint = "" if config.token else " (set MSHIP_TOKEN to an /api token)"
        raise CliError(f"not allowed: {message}{hint}", UNREACHABLE)
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
