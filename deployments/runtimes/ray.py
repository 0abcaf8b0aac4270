"""The ray runtime: each engine replica is a Ray job on the site's Ray cluster.

Ray places the job by what it asks for (`num_gpus`, the deployment's memory, custom
resources from the deployment's `ray_resources`), on whichever node has room; the job runs
the same engine command as the process runtime, behind `deployments.engines.ray_entry`,
which picks the engine's port on that node and prints it. Modelship never imports Ray: it
drives the cluster's dashboard over HTTP (MSHIP_RAY_ADDRESS), the Jobs REST API for the
engines and the state API for the nodes. A job is named `mship-<site>-<deployment id>-
<replica>-<random>` and carries the site in its metadata, so a restarted Modelship finds its
own jobs (`managed`). The jobs outlive Modelship: stopping them is the deployer's stop.

What the dashboard shows of a job (its entrypoint, its runtime_env) anyone who reaches the
dashboard can read, so the engine's environment (HF_TOKEN among it) is not in it: it goes in
a file readable by Modelship's user only (MSHIP_RAY_SECRETS_DIR, under var/ by default), whose
path the entrypoint names and which ray_entry reads and removes. A node reads it where it
shares that folder: the nodes of a cluster on this host do; remote nodes need the folder
mounted at the same path, as Modelship's user (README: Engines across a Ray cluster). The
engine listens on its node's own address (of the cluster's node addresses, the one the node
has), never on every interface.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from django.conf import settings

from common.secret_files import write_secret
from deployments.engines.ray_entry import HOST_LINE, PORT_LINE
from deployments.runtimes.base import EngineUnreachable, Handle, Launch, RuntimeError_

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterator

LIVE = frozenset({"PENDING", "RUNNING"})
POLL_S = 0.25
STOP_EXTRA_S = 10.0  # past the grace: Ray's SIGKILL, and its status write


def unreachable(exc: Exception) -> EngineUnreachable:
    return EngineUnreachable(f"Ray is unreachable: {exc}")


class RayRuntime:
    name = "ray"

    def __init__(self) -> None:
        # One client, and its kept-alive connections, for every caller's thread (httpx's
        # client is thread-safe); the address is read per call, as settings may change.
        self.client = httpx.Client(timeout=30)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        address = settings.MSHIP_RAY_ADDRESS
        if not address:
            raise RuntimeError_(
                "the ray runtime needs MSHIP_RAY_ADDRESS (the Ray dashboard's URL, "
                "http://<head>:8265)"
            )
        try:
            return self.client.request(method, address.rstrip("/") + path, **kwargs)
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc

    def _job(self, job: str) -> dict[str, Any] | None:
        answer = self._call("GET", f"/api/jobs/{job}")
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise RuntimeError_(f"Ray refused to show job {job}: {answer.text[:300]}")
        found: dict[str, Any] = answer.json()
        return found

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes as the state API reports them (id, IP, state, resources)."""
        answer = self._call("GET", "/api/v0/nodes", params={"detail": "1", "limit": "10000"})
        if answer.status_code != 200:
            raise RuntimeError_(f"Ray refused to list its nodes: {answer.text[:300]}")
        result: list[dict[str, Any]] = answer.json()["data"]["result"]["result"]
        return result

    def usage_by_node(self) -> dict[str, dict[str, list[float]]]:
        """Each node's resources as [used, total], by node id (the autoscaler's report)."""
        answer = self._call("GET", "/api/cluster_status")
        if answer.status_code != 200:
            raise RuntimeError_(f"Ray refused its cluster status: {answer.text[:300]}")
        report = answer.json()["data"]["clusterStatus"]["loadMetricsReport"]
        usage: dict[str, dict[str, list[float]]] = report.get("usageByNode") or {}
        return usage

    def prepare(self, image: str, progress: Callable[[str], None] | None = None) -> None:
        """Nothing to fetch ahead: the nodes run the engine's own command."""

    def env_file(self, job: str) -> Path:
        return Path(settings.MSHIP_RAY_SECRETS_DIR) / f"{job}.json"

    def launch(self, launch: Launch) -> Handle:
        site = settings.MSHIP_SITE
        job = f"mship-{site}-{launch.deployment_id}-{launch.replica}-{secrets.token_hex(4)}"
        grace = f"{settings.MSHIP_STOP_GRACE_S:g}"
        node_ips = ",".join(sorted({str(node["node_ip"]) for node in self.nodes()}))
        env_file = self.env_file(job)
        Path(settings.MSHIP_RAY_SECRETS_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
        write_secret(env_file, json.dumps(launch.env))
        entry = [sys.executable, "-m", "deployments.engines.ray_entry", "--grace", grace]
        entry += ["--node-ips", node_ips, "--env-file", str(env_file)]
        entry += ["--", *launch.argv]
        body: dict[str, Any] = {
            # exec: the entry leads the job's process group (see ray_entry).
            "entrypoint": "exec " + shlex.join(entry),
            "submission_id": job,
            "metadata": {
                "modelship_site": site,
                "deployment_id": str(launch.deployment_id),
                "deployment": launch.name,
                "replica": str(launch.replica),
                "fingerprint": launch.fingerprint,
            },
            "runtime_env": {
                "env_vars": {
                    "PYTHONPATH": str(settings.BASE_DIR),
                    # Ray's own SIGKILL comes after the entry's, which kills the engine.
                    "RAY_JOB_STOP_WAIT_TIME_S": str(int(settings.MSHIP_STOP_GRACE_S) + 5),
                }
            },
            "entrypoint_num_gpus": launch.num_gpus or 0,
            "entrypoint_num_cpus": 0,
        }
        if launch.memory_gib:
            body["entrypoint_memory"] = int(launch.memory_gib * 2**30)
        if launch.resources:
            body["entrypoint_resources"] = launch.resources
        try:
            answer = self._call("POST", "/api/jobs/", json=body)
        except BaseException:
            env_file.unlink(missing_ok=True)
            raise
        if answer.status_code != 200:
            env_file.unlink(missing_ok=True)
            raise RuntimeError_(f"Ray refused the job: {answer.text[:300]}")
        handle: Handle = {
            "runtime": self.name,
            "replica": launch.replica,
            "deployment_id": launch.deployment_id,
            "job": job,
            "fingerprint": launch.fingerprint,
            "gpus": None,
        }
        # One deadline for being placed and naming the port: the start timeout.
        deadline = time.monotonic() + settings.MSHIP_START_TIMEOUT_S
        try:
            info = self._until_running(job, deadline)
            host, port = self._reported_address(job, deadline)
            node = self._node(info.get("driver_node_id") or "")
        except BaseException:
            with contextlib.suppress(RuntimeError_):  # the reason it failed is what matters
                self.stop(handle, 0)
            raise
        handle.update(node_id=node["node_id"], node_ip=node["node_ip"], port=port)
        handle["url"] = f"http://{host}:{port}"
        return handle

    def _until_running(self, job: str, deadline: float) -> dict[str, Any]:
        """The job once it runs; RuntimeError_ with Ray's words when it ended first or Ray
        could not place it within the start timeout."""
        timeout = settings.MSHIP_START_TIMEOUT_S
        while True:
            info = self._job(job)
            if info is None:
                raise RuntimeError_(f"Ray lost job {job}")
            if info["status"] == "RUNNING":
                return info
            if info["status"] != "PENDING":
                raise RuntimeError_(f"the Ray job ended before it ran: {info.get('message')}")
            if time.monotonic() > deadline:
                raise RuntimeError_(
                    f"Ray could not place it within {timeout:g} s (start timeout): "
                    f"{info.get('message')}"
                )
            time.sleep(POLL_S)

    def _reported_address(self, job: str, deadline: float) -> tuple[str, int]:
        """The address and port ray_entry printed (in one write), read from the job's log."""
        timeout = settings.MSHIP_START_TIMEOUT_S
        while time.monotonic() < deadline:
            said = dict(
                line.split(": ", 1)
                for line in self._logs(job).splitlines()
                if line.startswith((PORT_LINE, HOST_LINE))
            )
            if PORT_LINE[:-2] in said and HOST_LINE[:-2] in said:
                return said[HOST_LINE[:-2]], int(said[PORT_LINE[:-2]])
            info = self._job(job)
            if info is None or info["status"] not in LIVE:
                message = info.get("message") if info else "gone"
                raise RuntimeError_(f"the Ray job ended before its engine started: {message}")
            time.sleep(POLL_S)
        raise RuntimeError_(f"the Ray job named no port within {timeout:g} s")

    def _node(self, node_id: str) -> dict[str, Any]:
        for node in self.nodes():
            if node["node_id"] == node_id:
                return node
        raise RuntimeError_(f"the Ray job runs on a node Ray does not list ({node_id or 'none'})")

    def _logs(self, job: str) -> str:
        answer = self._call("GET", f"/api/jobs/{job}/logs")
        if answer.status_code != 200:
            return ""
        logs: str = answer.json().get("logs", "")
        return logs

    def is_alive(self, handle: Handle) -> bool:
        info = self._job(handle["job"])
        return info is not None and info["status"] in LIVE

    def exit_reason(self, handle: Handle) -> str:
        info = self._job(handle["job"])
        if info is None:
            return "Ray no longer knows the job"
        return str(info.get("message") or f"the Ray job is {info['status'].lower()}")

    def stop(self, handle: Handle, grace_s: float) -> None:
        job = handle["job"]
        # Read and removed by ray_entry at its start; here where the job never started.
        self.env_file(job).unlink(missing_ok=True)
        answer = self._call("POST", f"/api/jobs/{job}/stop")
        if answer.status_code not in (200, 404):
            raise RuntimeError_(f"Ray refused to stop job {job}: {answer.text[:300]}")
        deadline = time.monotonic() + grace_s + STOP_EXTRA_S
        while self.is_alive(handle):
            if time.monotonic() > deadline:
                raise RuntimeError_(f"the Ray job {job} did not stop")
            time.sleep(POLL_S)

    def log_tail(self, handle: Handle, lines: int) -> str:
        return "\n".join(self._logs(handle["job"]).splitlines()[-lines:])

    def follow_log(self, handle: Handle, stop: threading.Event | None = None) -> Iterator[str]:
        # The REST API has no stream short of a websocket: poll the log for growth.
        seen = len(self._logs(handle["job"]))
        while not (stop is not None and stop.is_set()):
            text = self._logs(handle["job"])
            lines = text[seen:].split("\n")
            complete, partial = lines[:-1], lines[-1]
            yield from complete
            seen = len(text) - len(partial)
            if not self.is_alive(handle):
                return
            time.sleep(0.5)

    def managed(self) -> list[Handle] | None:
        if not settings.MSHIP_RAY_ADDRESS:
            return []  # a site without Ray has no jobs to look for
        answer = self._call("GET", "/api/jobs/")
        if answer.status_code != 200:
            raise RuntimeError_(f"Ray refused to list its jobs: {answer.text[:300]}")
        return [
            {
                "runtime": self.name,
                "job": info["submission_id"],
                "deployment_id": int(info["metadata"].get("deployment_id", "0") or 0),
                "replica": int(info["metadata"].get("replica", "0") or 0),
                "fingerprint": info["metadata"].get("fingerprint", ""),
                "status": info["status"].lower(),
            }
            for info in answer.json()
            if (info.get("metadata") or {}).get("modelship_site") == settings.MSHIP_SITE
        ]

    def remove(self, handle: Handle) -> None:
        """Stop a job no deployment owns and forget it (Ray deletes only ended jobs)."""
        self.env_file(handle["job"]).unlink(missing_ok=True)
        if handle.get("status") in ("pending", "running"):
            try:
                self.stop(handle, settings.MSHIP_STOP_GRACE_S)
            except EngineUnreachable:
                raise
            except RuntimeError_:
                return  # a job not placed yet ends once it is; a later adoption deletes it
        self._call("DELETE", f"/api/jobs/{handle['job']}")

    def gpus_of(self, handle: Handle) -> list[int] | None:
        return None  # Ray assigns the devices on its node; Modelship does not place them
