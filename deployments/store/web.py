"""A model pulled from an http(s) URL: one file, resumed where an earlier try stopped (a
Range request), its checksum verified where the URL or the server gives one, every
connection (redirects too) under the egress policy MCP servers meet."""

from __future__ import annotations

import base64
import hashlib
import re
import time
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import httpx
from django.conf import settings

from common.egress import (
    EgressRefused,
    Policy,
    guarded_client,
    host_networks,
    own_addresses,
    resolve_now,
)
from deployments.models import Deployment
from deployments.store.job import Job, PullFailed

if TYPE_CHECKING:
    from pathlib import Path

    from deployments.store.sources import Source

ATTEMPTS = 3
TIMEOUT = httpx.Timeout(30.0, read=120.0)
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
SHA256 = re.compile(r"[0-9a-f]{64}")


def pull_policy() -> Policy:
    """The MCP egress policy: its allowed hosts and https rule, and every engine's address
    and Docker networks refused unless allowed (an engine's admin endpoints have no auth)."""
    allowed = [h.strip().lower().rstrip(".") for h in settings.MSHIP_MCP_ALLOWED_HOSTS]
    engines: list[str] = []
    for urls, handle in Deployment.objects.values_list("engine_urls", "runtime_handle"):
        engines += [urlsplit(str(url)).hostname or "" for url in urls or ()]
        for replica in (handle or {}).get("replicas", []):
            engines += [str(subnet) for subnet in replica.get("subnets", ())]
    return Policy(
        allowed_names=frozenset(allowed),
        allowed_networks=host_networks(allowed),
        engine_networks=host_networks(h for h in engines if h),
        require_https=settings.MSHIP_MCP_REQUIRE_HTTPS,
        own_addresses=own_addresses(),
    )


def refusal(url: str, policy: Policy) -> str | None:
    """Why the URL may not be fetched: its form, then each address its host resolves to
    (checked again as each connection is made: the name may resolve otherwise then)."""
    host, port, why = policy.url_problem(url)
    if why is not None:
        return why
    try:
        addresses = resolve_now(host, port)
    except OSError:
        return "its host does not resolve"
    return next((why for ip in addresses if (why := policy.verdict(host, ip))), None)


def fetch(source: Source, job: Job) -> Path:
    url, _, fragment = source.ref.partition("#")
    expected = fragment.removeprefix("sha256=").lower() if fragment.startswith("sha256=") else ""
    if fragment and not SHA256.fullmatch(expected):
        raise PullFailed("a URL's fragment may only be #sha256=<64 hex digits>", keep=False)
    policy = pull_policy()
    if why := refusal(url, policy):
        raise PullFailed(f"{url} may not be fetched: {why}", keep=False)
    name = SAFE_NAME.sub("_", unquote(urlsplit(url).path.rsplit("/", 1)[-1]))[:200].lstrip(".")
    out = job.staging / (name or "model.bin")
    partial = out.with_name(out.name + ".part")
    job.staging.mkdir(parents=True, exist_ok=True)
    published = ""
    with guarded_client(policy, TIMEOUT) as client:
        for attempt in range(ATTEMPTS):
            try:
                published = download(client, url, partial, job) or published
                break
            except (httpx.TransportError, EgressRefused) as exc:
                if isinstance(exc, EgressRefused) or isinstance(exc.__cause__, EgressRefused):
                    raise PullFailed(f"{url} may not be fetched: {exc}", keep=False) from exc
                if attempt == ATTEMPTS - 1:
                    got = partial.stat().st_size if partial.exists() else 0
                    raise PullFailed(
                        f"the download stopped at {got} bytes ({type(exc).__name__}: {exc});"
                        " pulling it again resumes from there"
                    ) from exc
                time.sleep(2**attempt)
    digest = sha256_of(partial)
    for want, whose in ((expected, "the URL's"), (published, "the server's")):
        if want and digest != want:
            partial.unlink(missing_ok=True)
            raise PullFailed(
                f"the file's SHA-256 is {digest}, not {whose} {want}: nothing was kept",
                keep=False,
            )
    if expected or published:
        job.verified()
    partial.replace(out)
    return out


def download(client: httpx.Client, url: str, partial: Path, job: Job) -> str:
    """Into `partial`, from where it ends; the SHA-256 the server published, if any."""
    have = partial.stat().st_size if partial.exists() else 0
    headers = {"Range": f"bytes={have}-", "Accept-Encoding": "identity"} if have else {}
    with client.stream("GET", url, headers=headers) as answer:
        if answer.status_code == 416 and have:  # nothing past what we have: start again
            partial.unlink()
            return download(client, url, partial, job)
        if answer.status_code not in (200, 206):
            keep = answer.status_code >= 500 or answer.status_code == 429
            raise PullFailed(f"{url} answered {answer.status_code}", keep=keep)
        resumed = answer.status_code == 206
        if not resumed:
            have = 0
        length = answer.headers.get("content-length")
        if length is not None and length.isdigit():
            job.expect(have + int(length), already=have)
        job.counted = have
        with partial.open("ab" if resumed else "wb") as sink:
            for chunk in answer.iter_bytes():  # as it arrives: a cut keeps what came
                sink.write(chunk)
                job.advance(len(chunk))
        return published_sha256(answer.headers)


def published_sha256(headers: httpx.Headers) -> str:
    """A whole file's SHA-256 as a server states it: a Repr-Digest/Digest field, or the
    Hub's X-Linked-Etag (an LFS file's SHA-256)."""
    for field in ("repr-digest", "digest"):
        for part in headers.get(field, "").split(","):
            algorithm, _, value = part.strip().partition("=")
            if algorithm.lower() in ("sha-256", "sha256") and value:
                try:
                    return base64.b64decode(value.strip(":")).hex()
                except ValueError:
                    continue
    linked = headers.get("x-linked-etag", "").strip('"').lower()
    return linked if SHA256.fullmatch(linked) else ""


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
