"""Settings of usage recording and budgets (openai_api/usage/), read by settings.py."""

from __future__ import annotations

from common.env import env_bool, env_choice, env_float, env_int

# Off: no usage is recorded and no budget is checked (the bench's baseline; a site that
# meters elsewhere).
MSHIP_USAGE_RECORD = env_bool("MSHIP_USAGE_RECORD", True)
# Each gateway process adds up its requests per minute in memory and writes them to the
# usage table this often (a crash loses at most this much; a clean stop, nothing).
MSHIP_USAGE_FLUSH_S = env_float("MSHIP_USAGE_FLUSH_S", 10)
# Usage rows are kept this many days (a django-q sweep deletes older ones; 0: forever).
MSHIP_USAGE_RETENTION_DAYS = env_int("MSHIP_USAGE_RETENTION_DAYS", 400)
# Budgets: the totals a gateway checks against are read again this often (from Redis where
# REDIS_URL is set, else from the usage table), so a request sees what every process used
# up to then; a changed budget applies with the route table (MSHIP_ROUTE_REFRESH_S).
MSHIP_BUDGET_REFRESH_S = env_float("MSHIP_BUDGET_REFRESH_S", 1)
# At this share of a budget: an audit entry, a log line and the budget metric say so.
MSHIP_BUDGET_WARN_PERCENT = env_float("MSHIP_BUDGET_WARN_PERCENT", 80)
# While the totals cannot be read (Redis and the database down) for longer than
# MSHIP_BUDGET_STALE_S: "open" serves on with the last totals plus this process's own
# count; "closed" refuses the requests of keys that have a budget (503 budget_unavailable).
MSHIP_BUDGET_FAILURE = env_choice("MSHIP_BUDGET_FAILURE", "open", ("open", "closed"))
MSHIP_BUDGET_STALE_S = env_float("MSHIP_BUDGET_STALE_S", 30)
# A key with a budget (its own or its team's) and no max_concurrency of its own runs at most
# this many requests at once on the site (0: no cap): each holds its reservation until it
# ends, and a burst of a budgeted key cannot fill every engine.
MSHIP_BUDGET_MAX_CONCURRENCY = env_int("MSHIP_BUDGET_MAX_CONCURRENCY", 16)
# On: the GPU-seconds of an on-demand start or wake (launch to ready) count against the
# GPU-second budgets of the keys whose requests waited for it, shared equally among them.
# Off (the default): they are the deployment's load account, shown beside the keys' use.
MSHIP_USAGE_BUDGET_LOADS = env_bool("MSHIP_USAGE_BUDGET_LOADS", False)
# Streamed chat and completions ask the engine for usage (stream_options.include_usage)
# and drop its usage chunk from the answer of a client that did not ask for it.
MSHIP_USAGE_FROM_STREAMS = env_bool("MSHIP_USAGE_FROM_STREAMS", True)
