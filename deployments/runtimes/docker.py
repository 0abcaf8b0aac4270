"""Engines as Docker containers, through the docker SDK.

Every container carries labels naming the site, the deployment and a fingerprint of its
configuration, so a restarted Modelship finds, adopts, replaces or removes it. It runs with
an init process (an engine that ignores SIGTERM must not hold `docker stop` for the whole
timeout) and no restart policy: Modelship decides about restarts.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import TYPE_CHECKING, Any

import docker
import requests
from django.conf import settings

from deployments.runtimes.base import (
    EngineUnreachable,
    Handle,
    Launch,
    RuntimeError_,
    gpu_list,
    parse_gpu_list,
)
from deployments.runtimes.docker_network import own_network_names, url_on_network
from deployments.runtimes.docker_options import create_kwargs
from deployments.runtimes.pull_progress import PullProgress

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

CONTAINER_PORT = 8000
# How a registry says it has no such image (Docker's words vary by registry and version).
NOT_FOUND = re.compile(
    r"not found|manifest unknown|does not exist|repository .* not found|404", re.IGNORECASE
)
LABEL = "modelship"


def label(key: str) -> str:
    return f"{LABEL}.{key}"


def container_name(site: str, name: str, replica: int) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", name)
    return f"{site}-{safe}-{replica}"


def unreachable(exc: Exception) -> EngineUnreachable:
    return EngineUnreachable(f"the Docker Engine is unreachable: {exc}")


NETWORK_LOCK = threading.Lock()  # one process's launches make the network once


class DockerRuntime:
    name = "docker"

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}

    @property
    def client(self) -> Any:
        """A client of the configured daemon (MSHIP_DOCKER_HOST, else Docker's environment)."""
        host = settings.MSHIP_DOCKER_HOST
        if host not in self._clients:
            try:
                if host:
                    client = docker.DockerClient(base_url=host, version="auto", timeout=60)
                else:
                    client = docker.from_env(version="auto", timeout=60)
                self._clients[host] = client
            except docker.errors.DockerException as exc:
                raise unreachable(exc) from exc
        return self._clients[host]

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the SDK, turning a dead daemon into EngineUnreachable and its refusals into
        RuntimeError_ with the daemon's own words."""
        try:
            return fn(*args, **kwargs)
        except (requests.exceptions.ConnectionError, ConnectionError) as exc:
            raise unreachable(exc) from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                raise
            raise RuntimeError_(str(exc.explanation or exc)) from exc
        except docker.errors.DockerException as exc:
            if "Connection" in str(exc) or "connect" in str(exc):
                raise unreachable(exc) from exc
            raise RuntimeError_(str(exc)) from exc

    def _container(self, handle: Handle) -> Any | None:
        try:
            return self._call(self.client.containers.get, handle["container_id"])
        except docker.errors.NotFound:
            return None

    def network(self) -> Any:
        """The engines' network, made by the first launch that needs it: launches run side
        by side (the start gate covers claims), so two may find it missing at once."""
        name = settings.MSHIP_DOCKER_NETWORK
        with NETWORK_LOCK:
            try:
                return self._call(self.client.networks.get, name)
            except docker.errors.NotFound:
                pass
            try:
                return self._call(
                    self.client.networks.create, name, driver="bridge", labels={label("site"): "*"}
                )
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # made meanwhile by another process of the host
                    raise
                return self._call(self.client.networks.get, name)

    def prepare(self, image: str, progress: Callable[[str], None] | None = None) -> None:
        """The image, pulled unless the daemon has it, its progress told to `progress`."""
        if image:
            self.ensure_image(image, progress)

    def ensure_image(self, image: str, progress: Callable[[str], None] | None = None) -> None:
        try:
            self._call(self.client.images.get, image)
            return
        except docker.errors.NotFound:
            pass
        repository, tag = docker.utils.parse_repository_tag(image)
        tracker = PullProgress(image, progress or (lambda line: None))
        try:
            events = self._call(
                self.client.api.pull, repository, tag=tag or "latest", stream=True, decode=True
            )
            for event in events:
                if "error" in event:
                    raise RuntimeError_(str(event["error"]))
                tracker.update(event)
        except (docker.errors.NotFound, RuntimeError_) as exc:
            message = getattr(exc, "explanation", None) or str(exc)
            if NOT_FOUND.search(message):
                raise RuntimeError_(
                    f"image {image!r} not found in any configured registry ({message})"
                ) from exc
            raise RuntimeError_(f"cannot pull image {image!r}: {message}") from exc
        except requests.exceptions.RequestException as exc:
            raise unreachable(exc) from exc

    def launch(self, launch: Launch) -> Handle:
        if not launch.image:
            raise RuntimeError_(f"{launch.name}: no image to run (set image: in its config)")
        self.ensure_image(launch.image)
        network = self.network()
        argv = [
            a.replace("{host}", "0.0.0.0").replace("{port}", str(CONTAINER_PORT))
            for a in launch.argv
        ]
        site = settings.MSHIP_SITE
        name = container_name(site, launch.name, launch.replica)
        self._remove_stale(name)
        # Inside a container on the engines' network, Modelship reaches them by address; else
        # through a port published on the loopback interface only.
        inside = settings.MSHIP_DOCKER_NETWORK in own_network_names(self.client)
        env = launch.env
        if network.attrs.get("Internal"):
            # No route out (compose.yaml's engines network): nothing can be published from
            # it, and a model comes from the cache, the Hub being out of reach.
            if not inside:
                raise RuntimeError_(
                    f"the engines' network {network.name!r} is internal: only a Modelship "
                    "running in a container on it can reach its engines (MSHIP_DOCKER_NETWORK)"
                )
            env = {"HF_HUB_OFFLINE": "1", **env}
        kwargs = create_kwargs(
            launch.options,
            num_gpus=launch.num_gpus,
            model=launch.model,
            env=env,
            mounts=launch.mounts,
            placed=launch.gpus,
            cache=launch.cache,
        )
        container = self._call(
            self.client.containers.create,
            launch.image,
            entrypoint=argv[:1],
            command=argv[1:],
            name=name,
            labels={
                label("site"): site,
                label("deployment_id"): str(launch.deployment_id),
                label("deployment"): launch.name,
                label("replica"): str(launch.replica),
                label("fingerprint"): launch.fingerprint,
                **({} if launch.gpus is None else {label("gpus"): gpu_list(launch.gpus)}),
            },
            init=True,
            restart_policy={"Name": "no"},
            network=network.name,
            ports={} if inside else {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", None)},
            detach=True,
            **kwargs,
        )
        handle: Handle = {
            "runtime": self.name,
            "replica": launch.replica,
            "container_id": container.id,
            "container_name": name,
            "image": launch.image,
            "fingerprint": launch.fingerprint,
            "gpus": launch.gpus,
            # The engines' network, so the gateway's MCP egress can refuse its addresses.
            "subnets": [
                entry["Subnet"]
                for entry in (network.attrs.get("IPAM", {}).get("Config") or [])
                if entry.get("Subnet")
            ],
        }
        try:
            self._call(container.start)
            container.reload()
        except RuntimeError_:
            self.remove(handle)
            raise
        if inside:
            handle["url"] = url_on_network(container, network.name, CONTAINER_PORT)
        else:
            binding = container.attrs["NetworkSettings"]["Ports"][f"{CONTAINER_PORT}/tcp"][0]
            handle["url"] = f"http://127.0.0.1:{binding['HostPort']}"
        return handle

    def _remove_stale(self, name: str) -> None:
        """A container of the same name left by a crash would block the create."""
        try:
            old = self._call(self.client.containers.get, name)
        except docker.errors.NotFound:
            return
        if old.labels.get(label("site")) == settings.MSHIP_SITE:
            self._call(old.remove, force=True)

    def is_alive(self, handle: Handle) -> bool:
        container = self._container(handle)
        return container is not None and container.status in ("running", "restarting")

    def exit_reason(self, handle: Handle) -> str:
        container = self._container(handle)
        if container is None:
            return "the engine's container is gone"
        state = container.attrs.get("State", {})
        if state.get("OOMKilled"):
            return "out of memory (killed)"
        limit = (container.attrs.get("HostConfig") or {}).get("Memory") or 0
        if state.get("ExitCode") == 137 and limit:
            # Docker misses the OOM flag now and then on cgroup v2 (moby/moby#38352): a
            # SIGKILL under a memory limit that Modelship did not send is the OOM killer's.
            return f"out of memory (killed at its {limit / 2**20:,.0f} MiB limit)"
        if state.get("Error"):
            return f"the container failed: {state['Error']}"
        return f"the engine exited with code {state.get('ExitCode')}"

    def stop(self, handle: Handle, grace_s: float) -> None:
        container = self._container(handle)
        if container is None:
            return
        # docker stop sends SIGTERM to the init process, SIGKILL after the timeout.
        try:
            self._call(container.stop, timeout=max(1, round(grace_s)))
        except docker.errors.NotFound:
            return
        self.remove(handle)

    def remove(self, handle: Handle) -> None:
        container = self._container(handle)
        if container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self._call(container.remove, force=True)

    def gpus_of(self, handle: Handle) -> list[int] | None:
        container = self._container(handle)
        if container is None or label("gpus") not in container.labels:
            return None
        return parse_gpu_list(container.labels[label("gpus")])

    def log_tail(self, handle: Handle, lines: int) -> str:
        container = self._container(handle)
        if container is None:
            return ""
        data = self._call(container.logs, tail=lines, stdout=True, stderr=True)
        return bytes(data).decode(errors="replace").rstrip("\n")

    def follow_log(self, handle: Handle, stop: threading.Event | None = None) -> Iterator[str]:
        container = self._container(handle)
        if container is None:
            return
        stream = self._call(container.logs, stream=True, follow=True, tail=0)
        if stop is not None:
            # The stream blocks until the engine's next line: a quiet engine would hold this
            # thread long after the follower left. Closing the stream ends the wait.
            threading.Thread(target=close_when, args=(stop, stream), daemon=True).start()
        pending = b""
        try:
            for chunk in stream:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    yield line.decode(errors="replace")
                if stop is not None and stop.is_set():
                    return
        except Exception:
            if stop is not None and stop.is_set():
                return  # the stream closed under it: the follower left
            raise

    def configured(self) -> bool:
        """Whether this host has a Docker Engine to ask at all."""
        return bool(
            settings.MSHIP_DOCKER_HOST
            or os.environ.get("DOCKER_HOST")
            or os.path.exists("/var/run/docker.sock")
        )

    def managed(self) -> list[Handle]:
        if not self.configured():
            return []  # a site without Docker has no containers to look for
        containers = self._call(
            self.client.containers.list,
            all=True,
            filters={"label": f"{label('site')}={settings.MSHIP_SITE}"},
        )
        return [
            {
                "runtime": self.name,
                "container_id": c.id,
                "container_name": c.name,
                "deployment_id": int(c.labels.get(label("deployment_id"), "0") or 0),
                "replica": int(c.labels.get(label("replica"), "0") or 0),
                "fingerprint": c.labels.get(label("fingerprint"), ""),
                "status": c.status,
            }
            for c in containers
        ]


def close_when(stop: threading.Event, stream: Any) -> None:
    """Close a Docker log stream once its follower leaves (docker's stream is made to be
    closed from another thread: it shuts its socket down)."""
    stop.wait()
    with contextlib.suppress(Exception):
        stream.close()
