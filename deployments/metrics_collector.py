"""What /metrics reads from the control plane at scrape time: each deployment's state,
replicas and held memory, and the host's memory per GPU (one read of each per scrape)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from deployments.memory import host_summary
from deployments.models import Deployment, State

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

GIB = 1024**3


class ControlPlaneCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "modelship_deployment_state",
            "1 for the state each deployment is in, 0 for the others.",
            labels=["deployment", "state"],
        )
        replicas = GaugeMetricFamily(
            "modelship_deployment_replicas",
            "Engine replicas each deployment runs when up.",
            labels=["deployment", "mode"],
        )
        rows = Deployment.objects.only(
            "name",
            "state",
            "num_replicas",
            "autoscaling_config",
            "replicas",
            "mode",
            "system",
            "pending_mode",
        )
        names = []
        for row in rows:
            names.append(row.name)
            for each in State:
                state.add_metric([row.name, each.value], 1.0 if row.state == each else 0.0)
            replicas.add_metric([row.name, row.effective_mode], float(row.replica_count))
        yield state
        yield replicas
        yield from memory_families(host_summary(), names)


def memory_families(host: dict[str, object], names: list[str]) -> Iterator[Metric]:
    held = GaugeMetricFamily(
        "modelship_deployment_memory_held_bytes",
        "Accelerator memory each deployment holds in the budget (0 when it runs no engine).",
        labels=["deployment"],
    )
    rows: list[dict[str, Any]] = host["deployments"]  # type: ignore[assignment]
    holding = {row["name"]: row["holding_gib"] for row in rows}
    # Every deployment, so a chart of them starts at 0 rather than when the first one starts.
    for name in sorted({*names, *holding}):
        held.add_metric([name], holding.get(name, 0.0) * GIB)
    yield held
    host_memory = GaugeMetricFamily(
        "modelship_host_memory_bytes",
        "The host's memory budget: capacity, held by deployments, free; used as the driver"
        " reports it, where one does.",
        labels=["kind"],
    )
    for kind in ("capacity", "held", "free", "used"):
        value = host[f"{kind}_gib"]
        if value is not None:
            host_memory.add_metric([kind], float(value) * GIB)  # type: ignore[arg-type]
    yield host_memory
    gpu = GaugeMetricFamily(
        "modelship_gpu_memory_bytes",
        "Each GPU's memory: total, held by deployments, used (as the driver reports), free.",
        labels=["gpu", "name", "kind"],
    )
    for row in host["gpus"]:  # type: ignore[attr-defined]
        for kind in ("total", "held", "used", "free"):
            value = row[f"{kind}_gib"]
            if value is not None:
                gpu.add_metric([str(row["index"]), row["name"], kind], value * GIB)
    yield gpu
