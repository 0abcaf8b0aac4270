"""The Docker Engine stopped mid-run: clear errors, records left as they were, and a clean
settlement once it is back. A second dockerd of the test's own is stopped, never the one
the rest of the suite uses."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from deployments import deployer, tasks
from deployments.adoption import adopt_all
from deployments.models import AuditEntry, Deployment, DeploymentEvent, State
from deployments.runtimes import EngineUnreachable
from deployments.watchdog import check_once
from tests.conftest import host_lock, reply_of, wait_until
from tests.docker_support import docker_block

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.usefixtures("engines", "docker_site")


BRIDGE = "msd-br0"


class Daemon:
    """A dockerd with its own socket, state, bridge and address pool.

    Each start is on fresh state: a dockerd that starts again on its old state deletes the
    host's docker0, the other daemon's bridge. So "the daemon is back" here is a daemon whose
    containers did not survive, as after a host reboot.
    """

    def __init__(self) -> None:
        # A short folder: a unix socket path may not be long.
        self.root = Path(tempfile.mkdtemp(prefix="msd-", dir="/tmp"))
        self.socket = f"unix://{self.root}/docker.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.remove_bridge()  # one a crashed run left behind
        subprocess.run(["ip", "link", "add", "name", BRIDGE, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", "172.31.255.1/24", "dev", BRIDGE], check=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)

    def remove_bridge(self) -> None:
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)

    def start(self, image: str) -> None:
        self.starts += 1
        state = self.root / f"state-{self.starts}"
        args = ["--host", self.socket, "--pidfile", str(self.root / "pid")]
        args += ["--data-root", str(state / "data"), "--exec-root", str(state / "exec")]
        args += ["--bridge", BRIDGE, "--iptables=false", "--ip-masq=false"]
        args += ["--default-address-pool", "base=172.31.0.0/16,size=24"]
        self.process = subprocess.Popen(
            ["dockerd", *args],
            stdout=(self.root / "log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self.answers, 60)
        saved = subprocess.run(["docker", "save", image], capture_output=True, check=True)
        subprocess.run(
            ["docker", "-H", self.socket, "load", "-q"],
            input=saved.stdout,
            check=True,
            capture_output=True,
        )

    def answers(self) -> bool:
        done = subprocess.run(["docker", "-H", self.socket, "info"], capture_output=True)
        return done.returncode == 0

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


@pytest.fixture
def daemon(docker_site: Any, engine_image: str) -> Iterator[Daemon]:
    # The bridge and its addresses are the host's: two runs on one host (two clones) take
    # turns, and the bridge goes before the next one makes its own.
    with host_lock("second-dockerd"):
        second = Daemon()
        second.start(engine_image)
        docker_site.MSHIP_DOCKER_HOST = second.socket
        yield second
        if second.answers():
            subprocess.run(
                ["docker", "-H", second.socket, "rm", "-f", *running(second)],
                capture_output=True,
            )
            subprocess.run(
                ["docker", "-H", second.socket, "network", "prune", "-f"], capture_output=True
            )
        second.stop()
        second.remove_bridge()
    shutil.rmtree(second.root, ignore_errors=True)


def running(daemon: Daemon) -> list[str]:
    done = subprocess.run(["docker", "-H", daemon.socket, "ps", "-aq"], capture_output=True)
    return done.stdout.decode().split()


def test_it_keeps_the_records_while_the_daemon_is_down(
    make_deployment: Any, daemon: Daemon, engine_image: str
) -> None:
    serving = make_deployment("serving", runtime="docker", docker_options=docker_block())
    waiting = make_deployment("waiting", runtime="docker", docker_options=docker_block())
    deployer.restart(serving.pk)
    serving.refresh_from_db()
    assert reply_of(serving.engine_url)
    handle = serving.runtime_handle
    events_before = DeploymentEvent.objects.count()

    daemon.stop()

    # The watchdog cannot tell, so it fails nothing.
    assert check_once() == []
    # A stop is refused with the reason, and the record stays as it was.
    with pytest.raises(EngineUnreachable) as refused:
        deployer.stop(serving.pk)
    assert "the Docker Engine is unreachable" in str(refused.value)
    assert tasks.stop(serving.pk).startswith("refused: the Docker Engine is unreachable")
    serving.refresh_from_db()
    assert serving.state == State.READY
    assert serving.runtime_handle == handle
    # A start is refused too, and leaves the deployment as it was.
    assert tasks.start(waiting.pk).startswith("refused: the Docker Engine is unreachable")
    waiting.refresh_from_db()
    assert waiting.state == State.PLANNED
    assert "the Docker Engine is unreachable" in waiting.state_reason
    # Adoption leaves everything as it is.
    assert adopt_all()["unreachable"] == ["serving"]
    serving.refresh_from_db()
    assert serving.state == State.READY
    assert DeploymentEvent.objects.count() >= events_before
    assert AuditEntry.objects.count() == 0  # nothing was lost or made up

    daemon.start(engine_image)
    # The engine did not survive the daemon: the deployment is settled as stopped.
    outcome = adopt_all()
    assert outcome["stopped"] == ["serving"]
    wait_until(lambda: running(daemon) == [], 30)
    serving.refresh_from_db()
    assert serving.state == State.STOPPED
    deployer.restart(waiting.pk)
    assert Deployment.objects.get(pk=waiting.pk).state == State.READY
