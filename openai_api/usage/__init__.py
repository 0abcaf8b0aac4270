"""Usage and budgets: every gateway request's tokens and GPU-seconds, attributed to its key,
its team and its deployment (recorded in memory per minute, flushed in batches to
UsageMinute), and the budgets of keys and teams that the gateway checks where it checks the
rate limit."""
