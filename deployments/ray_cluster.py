"""The Ray cluster as /api/host shows it, on a site with the ray runtime: each node with its
GPUs, memory and custom resources (used of total, as Ray counts them) and the replicas of the
deployments Ray placed there."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from deployments.models import Deployment, Runtime, State
from deployments.runtimes import RuntimeError_, get_runtime
from deployments.runtimes.ray import RayRuntime

GIB = 2**30
# Ray's own bookkeeping resources, left out of a node's custom ones.
BUILT_IN = frozenset({"CPU", "GPU", "memory", "object_store_memory", "objectStoreMemory"})


def ray_runtime() -> RayRuntime:
    runtime = get_runtime(Runtime.RAY)
    assert isinstance(runtime, RayRuntime)
    return runtime


def cluster_summary() -> dict[str, Any] | None:
    """None on a site without Ray; a cluster that does not answer says why, with no nodes."""
    address = settings.MSHIP_RAY_ADDRESS
    if not address:
        return None
    runtime = ray_runtime()
    try:
        nodes = runtime.nodes()
        usage = runtime.usage_by_node()
    except RuntimeError_ as exc:
        return {"address": address, "reachable": False, "error": str(exc), "nodes": []}
    placed = replicas_by_node()
    return {
        "address": address,
        "reachable": True,
        "error": None,
        "nodes": [
            node_row(node, usage.get(node["node_id"], {}), placed.get(node["node_id"], []))
            for node in sorted(nodes, key=lambda n: (not n.get("is_head_node"), n["node_ip"]))
        ],
    }


def node_row(
    node: dict[str, Any], usage: dict[str, list[float]], replicas: list[dict[str, Any]]
) -> dict[str, Any]:
    total: dict[str, float] = node.get("resources_total") or {}

    def used(name: str) -> float:
        return float(usage.get(dashboard_key(name), [0.0, 0.0])[0])

    return {
        "node_id": node["node_id"],
        "ip": node["node_ip"],
        "head": bool(node.get("is_head_node")),
        "state": node["state"].lower(),
        "gpus": total.get("GPU", 0.0),
        "gpus_used": used("GPU"),
        "memory_gib": round(total.get("memory", 0.0) / GIB, 3),
        "memory_used_gib": round(used("memory") / GIB, 3),
        "resources": {
            name: {"used": used(name), "total": amount}
            for name, amount in sorted(total.items())
            if name not in BUILT_IN and not name.startswith("node:")
        },
        "deployments": replicas,
    }


def dashboard_key(name: str) -> str:
    """A resource's name as the dashboard's cluster status spells it: it rewrites every key
    from snake case to camel case (`worker_b` -> `workerB`), resource names included."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def replicas_by_node() -> dict[str, list[dict[str, Any]]]:
    """Where the running replicas of ray deployments are, by the handles their starts kept."""
    found: dict[str, list[dict[str, Any]]] = {}
    running = Deployment.objects.filter(runtime=Runtime.RAY).exclude(
        state__in=(State.PLANNED, State.STOPPED, State.FAILED)
    )
    for row in running.order_by("name"):
        for handle in (row.runtime_handle or {}).get("replicas", []):
            if handle.get("node_id"):
                found.setdefault(handle["node_id"], []).append(
                    {"name": row.name, "replica": handle.get("replica", 0), "url": handle["url"]}
                )
    return found
