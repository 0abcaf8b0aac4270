"""A container registry on the loopback interface (the Docker Engine trusts 127.0.0.0/8
without TLS), serving one image slowly enough that a pull takes seconds: the engine image's
skeleton and a layer of random bytes. The Registry HTTP API v2, as much of it as a pull
uses: /v2/, manifests and blobs."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import docker
import pytest

from tests.docker_support import skeleton

if TYPE_CHECKING:
    from collections.abc import Iterator

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
PAYLOAD_BYTES = 4 * 2**20
CHUNK = 64 * 1024


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def payload_layer() -> bytes:
    out = io.BytesIO()
    data = os.urandom(PAYLOAD_BYTES)  # random: gzip cannot shrink it, the pull moves it all
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("payload.bin")
        info.size, info.mtime = len(data), 0
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@dataclass
class Registry:
    port: int
    name: str
    tag: str
    seconds: float  # how long the large layer takes to send
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifest: bytes = b""
    sending: threading.Event = field(default_factory=threading.Event)
    sent: threading.Event = field(default_factory=threading.Event)

    @property
    def image(self) -> str:
        return f"127.0.0.1:{self.port}/{self.name}:{self.tag}"

    def build(self) -> None:
        layers = [skeleton(), payload_layer()]
        compressed = [gzip.compress(layer, mtime=0) for layer in layers]
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [digest(layer) for layer in layers]},
            }
        ).encode()
        self.blobs = {digest(blob): blob for blob in [config, *compressed]}
        self.manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {
                    "mediaType": "application/vnd.docker.container.image.v1+json",
                    "size": len(config),
                    "digest": digest(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                        "size": len(blob),
                        "digest": digest(blob),
                    }
                    for blob in compressed
                ],
            }
        ).encode()


def handler(registry: Registry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def unknown(self) -> None:
            errors = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}
            self.answer(404, json.dumps(errors).encode(), {"Content-Type": "application/json"})

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            prefix = f"/v2/{registry.name}/"
            if path in ("/v2/", "/v2"):
                self.answer(200, b"{}", {"Content-Type": "application/json"})
            elif (
                path == prefix + f"manifests/{registry.tag}"
                or path == prefix + "manifests/" + digest(registry.manifest)
            ):
                headers = {
                    "Content-Type": MANIFEST,
                    "Docker-Content-Digest": digest(registry.manifest),
                }
                self.answer(200, registry.manifest, headers)
            elif path.startswith(prefix + "blobs/") and path.rsplit("/", 1)[1] in registry.blobs:
                self.send_blob(registry.blobs[path.rsplit("/", 1)[1]])
            else:
                self.unknown()

        def send_blob(self, blob: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(blob)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if self.command == "HEAD":
                return
            slow = len(blob) > 2**20
            if slow:
                registry.sending.set()
            pause = registry.seconds / max(1, len(blob) // CHUNK)
            for offset in range(0, len(blob), CHUNK):
                self.wfile.write(blob[offset : offset + CHUNK])
                if slow:
                    time.sleep(pause)
            if slow:
                registry.sent.set()

    return Handler


@pytest.fixture
def slow_registry(docker_client: Any) -> Iterator[Registry]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    registry = Registry(server.server_address[1], "mstest/slow", uuid.uuid4().hex[:12], 4.0)
    registry.build()
    server.RequestHandlerClass = handler(registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield registry
    server.shutdown()
    with contextlib.suppress(docker.errors.DockerException):  # never pulled, or gone
        docker_client.images.remove(registry.image, force=True)
