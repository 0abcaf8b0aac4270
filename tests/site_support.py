"""What the site scheduler's tests (tests/test_site_scheduler.py) share: a `serve` of four
workers or one on the tests' database, and the requests and readings they make of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.conf import settings

from deployments import deployer
from deployments.models import Deployment, State
from deployments.runtimes.process import free_port
from ondemand.scheduler import wire
from tests.conftest import REPO, answers, env_for_subprocess, wait_until

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Iterator

HI = [{"role": "user", "content": "hi"}]
# A worker or the owner that dies sooner after its start stops Modelship (serve's rule):
# the tests that kill one wait until both have lived longer.
LIVED_S = 11.0


@dataclass
class Site:
    url: str
    serve: subprocess.Popen[bytes]
    run_dir: Path
    log: Path
    began: float
    workers: int
    var: Path = Path()  # its VAR_DIR

    @property
    def socket(self) -> Path:
        return self.run_dir / "scheduler.sock"

    def children(self, pattern: str) -> list[int]:
        found = subprocess.run(
            ["pgrep", "-P", str(self.serve.pid), "-f", pattern], capture_output=True, text=True
        )
        return [int(pid) for pid in found.stdout.split()]

    def lived(self) -> None:
        time.sleep(max(0.0, self.began + LIVED_S - time.monotonic()))


@pytest.fixture(scope="module", params=[4, 1], ids=["workers-4", "workers-1"])
def served(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    django_db_blocker: Any,
    tmp_path_factory: Any,
) -> Iterator[Site]:
    """`serve --workers 4` on the tests' database, for the module: 17 GiB of memory; then
    the same tests against `serve --workers 1` (a lone worker is its own scheduler: the
    behaviour is the site's either way). Tests of the scheduler's own process skip it."""
    with site_of(request.param, django_db_blocker, tmp_path_factory) as site:
        yield site


@contextlib.contextmanager
def site_of(workers: int, django_db_blocker: Any, tmp_path_factory: Any) -> Iterator[Site]:
    """`serve --workers N` on the tests' database, with 17 GiB of memory, until the block
    ends."""
    folder = tmp_path_factory.mktemp(f"workers-{workers}")
    # A Unix socket's path is short (108 bytes): pytest's folders can be longer.
    run_dir = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))
    port = free_port("127.0.0.1")
    log = folder / "serve.log"
    with django_db_blocker.unblock():
        env = env_for_subprocess(
            MSHIP_VAR_DIR=str(folder / "var"),
            MSHIP_RUN_DIR=str(run_dir),
            MSHIP_MEMORY_CAPACITY_GIB="17",
            MSHIP_ROUTE_REFRESH_S="0.05",
            MSHIP_SECRET_KEY=settings.SECRET_KEY,
            MSHIP_SCHEDULER_REBUILD_S="1",
            MSHIP_STOP_GRACE_S="2",
            MSHIP_USAGE_FLUSH_S="0.2",
        )
        serve = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", str(workers)],
            cwd=REPO,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        began = time.monotonic()
        url = f"http://127.0.0.1:{port}"
        site = Site(url, serve, run_dir, log, began, workers, folder / "var")

        def up() -> bool:
            return answers(url + "/health") and (workers == 1 or site.socket.exists())

        try:
            wait_until(up, 120)
            if workers > 1:
                assert len(site.children("modelship_site.server")) == workers
            yield site
        finally:
            serve.terminate()
            serve.wait(60)


@pytest.fixture(scope="module")
def four_workers(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: Any
) -> Iterator[Site]:
    """`serve --workers 4` for the module (a test that needs no `--workers 1` twin)."""
    with site_of(4, django_db_blocker, tmp_path_factory) as site:
        yield site


@pytest.fixture
def four(served: Site) -> Site:
    """The site of several workers, for the tests of the scheduler's own process."""
    if served.workers == 1:
        pytest.skip("a lone worker has no scheduler process, link or socket")
    return served


def known(url: str, key: str) -> str:
    headers = {"authorization": f"Bearer {key}"}
    wait_until(lambda: httpx.get(url + "/v1/models", headers=headers).status_code != 401, 10)
    return key


def shown(url: str, key: str, name: str, state: str | None = None) -> None:
    """Wait until every worker's route table has the deployment (in `state`)."""

    def listed() -> bool:
        for _ in range(8):  # new connections: the kernel spreads them over the workers
            answer = httpx.get(
                f"{url}/v1/models/{name}/status", headers={"authorization": f"Bearer {key}"}
            )
            if answer.status_code != 200 or (state and answer.json()["state"] != state):
                return False
        return True

    wait_until(listed, 15)


def ask(url: str, key: str, model: str, timeout: float = 120, **body: Any) -> tuple[int, float]:
    """One chat request from a new connection: its status and seconds."""
    began = time.monotonic()
    with httpx.Client(timeout=timeout) as client:
        answer = client.post(
            url + "/v1/chat/completions",
            json={"model": model, "messages": HI, **body},
            headers={"authorization": f"Bearer {key}"},
        )
    return answer.status_code, time.monotonic() - began


def streams(url: str, key: str, model: str, count: int, **body: Any) -> list[threading.Thread]:
    """`count` streaming requests at once, each from its own connection; their statuses
    (and whether each ended with [DONE]) go into `done` on the returned threads."""
    done: list[tuple[int, bool]] = []

    def one() -> None:
        with (
            httpx.Client(timeout=120) as client,
            client.stream(
                "POST",
                url + "/v1/chat/completions",
                json={"model": model, "messages": HI, "stream": True, **body},
                headers={"authorization": f"Bearer {key}"},
            ) as answer,
        ):
            lines = [line for line in answer.iter_lines() if line]
            done.append((answer.status_code, bool(lines) and lines[-1] == "data: [DONE]"))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.done = done  # type: ignore[attr-defined]
        thread.start()
    return threads


def finished(threads: list[threading.Thread]) -> list[tuple[int, bool]]:
    for thread in threads:
        thread.join(180)
    return list(threads[0].done)  # type: ignore[attr-defined]


def engine_stats(deployment: Deployment) -> dict[str, Any]:
    deployment.refresh_from_db()
    return dict(httpx.get(deployment.engine_urls[0] + "/sim/stats").json())


def ten_gib_on_demand(make: Callable[..., Deployment], configs: dict[str, Any]) -> None:
    """On-demand models of 10 GiB each: two do not fit in the site's 17 GiB together."""
    for name, config in configs.items():
        make(name, mode="on_demand", idle_timeout_s=600, memory_gib=10.0, config=config)


def started(make: Callable[..., Deployment], name: str, **fields: Any) -> Deployment:
    deployment = make(name, **fields)
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    return deployment


async def proven(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A link to the owner that proved the site's key, as a gateway's does."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    owners = (await wire.read(reader) or {})["nonce"]
    mine = wire.fresh_nonce()
    hello = {"op": "hello", "gateway": "test", "holding": [], "nonce": mine}
    writer.write(wire.encode({**hello, "proof": wire.proof("gateway", owners, mine)}))
    assert (await wire.read(reader) or {}).get("welcome") is True
    assert (await wire.read(reader) or {}).get("ev") == "rpm"  # the keys near their limit
    return reader, writer


def worker_serving(site: Site, client: socket.socket) -> int:
    """The worker whose socket is the server's end of the client's connection."""
    mine = client.getsockname()[1]
    server_port = client.getpeername()[1]
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == mine:
            inodes.add(fields[9])
    for pid in site.children("modelship_site.server"):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).removeprefix("socket:[").rstrip("]") in inodes:
                    return pid
    raise AssertionError("no worker holds the connection")
