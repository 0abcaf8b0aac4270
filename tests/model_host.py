"""A Hugging Face-compatible hub and plain file host on this machine, over a folder the test
fills: `<root>/<owner>/<repo>/<files>`. It answers what `huggingface_hub` calls (a model's
listing with each file's size, Git blob id and LFS SHA-256, pinned to a commit; HEAD and GET
on /resolve/, with Range) and plain GETs of /files/<path> with Range. Faults on demand: cut
a download off after some bytes, serve other bytes than the listing's hashes, lie about a
file's SHA-256 in its headers. Every request is recorded (method, path, Range)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".onnx")
LISTING = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/(.+))?$")
RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


@dataclass
class Faults:
    cut_after: int | None = None  # bytes of a body sent before the connection is dropped
    cuts: int = 0  # how many downloads to cut (each cut uses one)
    corrupt: set[str] = field(default_factory=set)  # files served with a byte flipped
    published_sha256: str = ""  # the SHA-256 /files/ states (Repr-Digest), true or not
    slow_bytes_per_s: int | None = None
    no_length: bool = False  # /files/ sent without a Content-Length (closed at its end)
    xet: bool = False  # LFS files said to be in Xet too (a hash and its token's route)


@dataclass
class ModelHost:
    root: Path
    url: str = ""
    faults: Faults = field(default_factory=Faults)
    requests: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def commit(self, repo: str) -> str:
        digest = hashlib.sha1(usedforsecurity=False)
        for path in sorted((self.root / repo).rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(self.root)).encode() + path.read_bytes())
        return digest.hexdigest()

    def listing(self, repo: str) -> dict[str, Any]:
        folder = self.root / repo
        siblings = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            entry: dict[str, Any] = {
                "rfilename": path.relative_to(folder).as_posix(),
                "size": len(data),
                "blobId": hashlib.sha1(
                    f"blob {len(data)}\0".encode() + data, usedforsecurity=False
                ).hexdigest(),
            }
            if path.suffix in LFS_SUFFIXES:
                entry["lfs"] = {
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            siblings.append(entry)
        return {"id": repo, "modelId": repo, "sha": self.commit(repo), "siblings": siblings}


def make_handler(host: ModelHost) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def record(self) -> None:
            with host.lock:
                host.requests.append(
                    {
                        "method": self.command,
                        "path": urlsplit(self.path).path,
                        "range": self.headers.get("Range", ""),
                    }
                )

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def answer(self, body: bool) -> None:
            self.record()
            path = unquote(urlsplit(self.path).path)
            if match := LISTING.match(path):
                repo = match.group(1)
                if not (host.root / repo).is_dir():
                    return self.plain(404, {"error": "Repository not found"}, repo_missing=True)
                return self.plain(200, host.listing(repo))
            if match := RESOLVE.match(path):
                repo, _, name = match.groups()
                file = host.root / repo / name
                if ".." in name or not file.is_file():
                    return self.plain(404, {"error": "Entry not found"})
                data = file.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                is_lfs = file.suffix in LFS_SUFFIXES
                blob = hashlib.sha1(
                    f"blob {len(data)}\0".encode() + data, usedforsecurity=False
                ).hexdigest()
                headers = {
                    "X-Repo-Commit": host.commit(repo),
                    "ETag": f'"{sha if is_lfs else blob}"',
                }
                if is_lfs:
                    headers["X-Linked-Etag"] = f'"{sha}"'
                    headers["X-Linked-Size"] = str(len(data))
                if is_lfs and host.faults.xet:
                    headers["X-Xet-Hash"] = sha
                    headers["X-Xet-Refresh-Route"] = (
                        f"{host.url}/api/models/{repo}/xet-read-token/x"
                    )
                if name in host.faults.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                return self.file(data, headers, body)
            if path.startswith("/files/"):
                file = host.root / path.removeprefix("/files/")
                if ".." in path or not file.is_file():
                    return self.plain(404, {"error": "not found"})
                headers = {}
                if host.faults.published_sha256:
                    digest = bytes.fromhex(host.faults.published_sha256)
                    headers["Repr-Digest"] = f"sha-256=:{base64.b64encode(digest).decode()}:"
                return self.file(file.read_bytes(), headers, body)
            return self.plain(404, {"error": "not found"})

        def plain(self, status: int, payload: dict[str, Any], repo_missing: bool = False) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if repo_missing:
                self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def file(self, data: bytes, headers: dict[str, str], body: bool) -> None:
            start = 0
            wanted = self.headers.get("Range", "")
            if match := re.fullmatch(r"bytes=(\d+)-", wanted):
                start = int(match.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Accept-Ranges", "bytes")
            if host.faults.no_length and "X-Repo-Commit" not in headers:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Content-Type", "application/octet-stream")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if not body:
                return
            part = data[start:]
            with host.lock:
                cut = host.faults.cut_after if host.faults.cuts > 0 else None
                if cut is not None:
                    host.faults.cuts -= 1
            if cut is not None:
                self.wfile.write(part[:cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            rate = host.faults.slow_bytes_per_s
            step = max(1, rate // 10) if rate else len(part)
            for offset in range(0, len(part), step):
                self.wfile.write(part[offset : offset + step])
                if rate:
                    threading.Event().wait(0.1)

    return Handler


@contextlib.contextmanager
def model_host(root: Path) -> Iterator[ModelHost]:
    host = ModelHost(root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(host))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield host
    finally:
        server.shutdown()
        server.server_close()
