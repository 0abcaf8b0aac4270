"""Modelship's own Prometheus metrics, one vocabulary for every process.

The ASGI server (one or several), the django-q cluster and its workers all record into
files under PROMETHEUS_MULTIPROC_DIR (set by the settings before this module is imported;
`manage.py serve` empties it at start), and /metrics sums them (modelship_site/metrics.py).
Recording is one lock-free-of-ours mmap write per value: the gateway records once per
request, never per chunk. Gauges of live work sum the live processes' values ("livesum"),
so a process that is gone stops counting once `serve` marks it dead.

Label values are bounded: a deployment's served name (never a requested name that matched
nothing), an endpoint from the registry or "other", a key's visible prefix.
"""

from __future__ import annotations

import functools
import threading

from prometheus_client import Counter, Gauge, Histogram, values

# prometheus_client picks how values are kept when it is first imported: something imported
# before the settings named the folder (a library, a test plugin) would leave this process
# counting in memory, where /metrics never reads. Chosen again here, once the folder is set.
values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]

# Seconds: a fast answer to a long generation.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Seconds: a wake from sleep to a big model's load.
COLD_START_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)

requests = Counter(
    "modelship_requests",
    "Requests answered by the gateway (/v1 and /ondemand).",
    ["model", "endpoint", "status", "key"],
)
request_duration = Histogram(
    "modelship_request_duration_seconds",
    "From the request's arrival to its answer's last byte.",
    ["model", "endpoint"],
    buckets=DURATION_BUCKETS,
)
time_to_first_byte = Histogram(
    "modelship_time_to_first_byte_seconds",
    "From the request's arrival to the first byte of its answer's body.",
    ["model", "endpoint"],
    buckets=DURATION_BUCKETS,
)
tokens = Counter(
    "modelship_tokens",
    "Tokens in and out, and of those in, cached (the engine's prefix cache served them): the"
    " engine's usage, else the gateway's estimate (openai_api/usage/),"
    " by model, team and key (a key's visible prefix only with MSHIP_METRICS_KEY_PREFIXES).",
    ["model", "direction", "team", "key"],
)
gpu_seconds = Counter(
    "modelship_gpu_seconds",
    "GPU-seconds attributed to requests: a replica's GPU share times the time it served,"
    " divided among the requests in flight on it.",
    ["model", "team", "key"],
)
routing_choices = Counter(
    "modelship_routing_choices",
    "Replicas chosen for requests to deployments with several, by why: affinity (the"
    " conversation's replica), prefix (its prefix key's place on the ring), load (the fewest"
    " outstanding) or round-robin (MSHIP_ROUTING_POLICY).",
    ["model", "reason"],
)
budget_used = Gauge(
    "modelship_budget_used_ratio",
    "The share of a key's or a team's budget used in its current period (1: exhausted).",
    ["owner", "name", "budget"],
    multiprocess_mode="livemax",
)
inflight = Gauge(
    "modelship_inflight_requests",
    "Requests being answered by a deployment's engines now.",
    ["deployment"],
    multiprocess_mode="livesum",
)
queued = Gauge(
    "modelship_queued_requests",
    "Requests waiting for an on-demand deployment's memory (the make-room queue).",
    ["deployment"],
    multiprocess_mode="livesum",
)
kv_saves = Counter(
    "modelship_kv_saves",
    "llama.cpp slot caches saved to disk as their engine stopped (deployments/kv_store.py).",
    ["deployment"],
)
slot_copies = Counter(
    "modelship_slot_copies",
    "llama.cpp slot caches copied into another slot of their replica for a request sharing"
    " their prefix (openai_api/routing/slot_copy.py), by outcome: copied, or failed (served"
    " as it would have been).",
    ["deployment", "outcome"],
)
kv_restores = Counter(
    "modelship_kv_restores",
    "Saved slot caches restored for a request after a start, by outcome: restored, or"
    " discarded (the engine refused the file: corrupt, truncated, not its model's).",
    ["deployment", "outcome"],
)
kv_saved_bytes = Gauge(
    "modelship_kv_saved_bytes",
    "Bytes of a deployment's slot caches saved on disk, as last written or restored.",
    ["deployment"],
    multiprocess_mode="mostrecent",
)
cold_starts = Counter(
    "modelship_cold_starts",
    "On-demand starts (or wakes) that requests waited for, by how they ended.",
    ["deployment", "outcome"],
)
cold_start_duration = Histogram(
    "modelship_cold_start_duration_seconds",
    "On-demand starts that ended ready: from the start to ready.",
    ["deployment"],
    buckets=COLD_START_BUCKETS,
)
make_room_stops = Counter(
    "modelship_make_room_stops",
    "Idle on-demand deployments stopped (or put to sleep) to make room for another.",
    ["deployment"],
)
starts = Counter(
    "modelship_starts",
    "Starts of on-demand deployments by what started them: a request, preload (serve's"
    " start), baseline (restored once the host was idle), retry (after running out of"
    " memory).",
    ["deployment", "reason"],
)
evictions = Counter(
    "modelship_evictions",
    "On-demand deployments put away (asleep or stopped) by why: idle (its timeout),"
    " make_room (for another's start), slept_long (asleep past MSHIP_SLEEP_MAX_S).",
    ["deployment", "reason"],
)
tier_changes = Counter(
    "modelship_tier_changes",
    "Engines entering a rest tier: asleep_1 (weights in host memory), asleep_2 (weights"
    " dropped), stopped.",
    ["deployment", "tier"],
)
queue_wait = Histogram(
    "modelship_queue_wait_seconds",
    "How long requests that waited for an on-demand model (its start, memory, a place)"
    " waited, by their class (the key's plus the deployment's).",
    ["priority"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900),
)
out_of_memory_retries = Counter(
    "modelship_out_of_memory_retries",
    "On-demand starts that ran out of memory and were tried once more, claiming what the"
    " engine showed it needs.",
    ["deployment"],
)
drains = Counter(
    "modelship_drains",
    "On-demand deployments in use that took no new request so that the queue's head, which"
    " waited MSHIP_COLLATION_S, could have their memory.",
    ["deployment"],
)
queue_timeouts = Counter(
    "modelship_queue_timeouts",
    "Requests that waited for memory longer than the queue timeout (answered 503).",
    ["deployment"],
)
start_failures = Counter(
    "modelship_start_failures",
    "Starts that ended failed (the engine exited, was unhealthy, or could not launch).",
    ["deployment"],
)


_route_table_lock = threading.Lock()


def route_table_loaded() -> Gauge:
    """When this gateway process last loaded its route table. Made on first use, so only the
    processes that load one have it: a gauge made at import is written at 0 by every process
    of the site (serve's own, the cluster's), and the oldest over them would be 1970. Made
    once, whichever thread asks first (a second registration would raise)."""
    with _route_table_lock:
        return _route_table_gauge()


@functools.cache
def _route_table_gauge() -> Gauge:
    return Gauge(
        "modelship_route_table_loaded_timestamp_seconds",
        "When the gateway's route table was last loaded (the oldest over live gateway"
        " processes); its age is time() minus this.",
        multiprocess_mode="livemin",
    )


@functools.lru_cache(maxsize=1024)
def inflight_of(deployment: str) -> Gauge:
    """The in-flight gauge of one deployment, looked up once (the gateway's per-request
    path; labels() takes a lock and builds its key each time)."""
    return inflight.labels(deployment)


# When this process last sent a request to each deployment (wall time), for the live admin.
last_request_at: dict[str, float] = {}


def inflight_here(deployment: str) -> int:
    """This process's requests in flight to a deployment: the live admin's count (the server
    that shows the admin is the gateway that forwards them)."""
    return int(inflight_of(deployment)._value.get())
