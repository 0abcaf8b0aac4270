"""Settings of the site's one scheduler (ondemand/scheduler/) and its caps on waiting, read by
settings.py."""

from __future__ import annotations

from common.env import env_float, env_int, env_str

# Requests one key may have waiting at once, in the on-demand queue and for max_concurrency
# places each (0: no cap): one key cannot fill a wait list that other keys share.
MSHIP_MAX_WAITING_PER_KEY = env_int("MSHIP_MAX_WAITING_PER_KEY", 100)
# The site's one scheduler (ondemand/scheduler/): where its owner listens, for the gateway
# processes to ask ("unix:/path" or "tcp://host:port"; empty: this process owns the
# scheduling itself, as a lone gateway does). `serve` sets it for its workers when it runs
# more than one, or when MSHIP_SCHEDULER_LISTEN is set; a --gateway-only host sets it to the
# engine host's MSHIP_SCHEDULER_LISTEN.
MSHIP_SCHEDULER_URL = env_str("MSHIP_SCHEDULER_URL", "")
# Where the owner `serve` runs also listens for --gateway-only hosts (host:port; empty: none).
MSHIP_SCHEDULER_LISTEN = env_str("MSHIP_SCHEDULER_LISTEN", "")
# How long a gateway waits for an owner that does not answer (restarting) before a request
# that needs it gets a retryable 503 scheduler_unavailable.
MSHIP_SCHEDULER_WAIT_S = env_float("MSHIP_SCHEDULER_WAIT_S", 10)
# A new owner grants nothing this long after it starts: the gateways reconnect and say what
# they hold first (their slots and places), so that no limit is passed meanwhile.
MSHIP_SCHEDULER_REBUILD_S = env_float("MSHIP_SCHEDULER_REBUILD_S", 1.5)
