"""Settings of the replica choice (openai_api/routing/), read by settings.py."""

from __future__ import annotations

from common.env import env_choice, env_float, env_int

# How a deployment with several replicas picks one for a request:
# "cache-aware": a conversation returns to the replica that served its earlier turns; a new
#   one goes where its leading text hashes (consistent hashing with bounded loads), so
#   requests that share a long system prompt meet the engine's prefix cache; else the
#   replica with the fewest requests outstanding.
# "least-outstanding": the fewest requests outstanding, always.
# "round-robin": each replica in turn.
MSHIP_ROUTING_POLICY = env_choice(
    "MSHIP_ROUTING_POLICY", "cache-aware", ("cache-aware", "least-outstanding", "round-robin")
)
# The bound on load: a replica already at (1 + ε) times the mean outstanding requests (rounded
# up) takes no affinity or prefix request; the request goes on round the ring.
MSHIP_ROUTING_LOAD_BOUND = env_float("MSHIP_ROUTING_LOAD_BOUND", 0.25)
# How much of the leading text (system prompt, then the first user message), in characters
# after whitespace is collapsed, is the prefix key: long shared system prompts key by the
# prompt alone, short ones by the conversation's opening.
MSHIP_ROUTING_PREFIX_CHARS = env_int("MSHIP_ROUTING_PREFIX_CHARS", 1000)
# A conversation's replica is remembered this long after its last turn (an engine's cache
# does not keep it much longer under load).
MSHIP_ROUTING_AFFINITY_S = env_float("MSHIP_ROUTING_AFFINITY_S", 900)
# Where REDIS_URL is set: each gateway process publishes its outstanding requests per
# replica, and reads the others', this often.
MSHIP_ROUTING_SYNC_S = env_float("MSHIP_ROUTING_SYNC_S", 0.25)
# Whose engine caches a request may meet (openai_api/cache_scope.py): "team" (a key's team, or
# the key where it has none), "key", or "site" (everyone's: one tenant's sites). Its prefix
# routing keys are scoped so, and vLLM keeps its prefix cache apart so (`cache_salt`).
MSHIP_CACHE_SCOPE = env_choice("MSHIP_CACHE_SCOPE", "team", ("team", "key", "site"))
# The cache figures an answer reports (cached tokens, llama.cpp's `timings` and slot): "own"
# where the engine keeps tenants' caches apart (vLLM salted), else taken out; "none": taken
# out everywhere; "all": passed on as the engine said them (a site of one tenant).
MSHIP_CACHE_FIGURES = env_choice("MSHIP_CACHE_FIGURES", "own", ("own", "none", "all"))
# llama.cpp's slot caches kept across a stop (deployments/kv_store.py): the most bytes the
# site's saved caches take on disk, under VAR_DIR/kv (0: none are kept); the oldest go first.
MSHIP_KV_KEEP_BYTES = env_int("MSHIP_KV_KEEP_BYTES", 4 << 30)
# A slot is saved at a stop where its conversation holds at least this many tokens and its
# last request ended within MSHIP_KV_KEEP_RECENT_S; a saved cache older than
# MSHIP_KV_KEEP_MAX_AGE_S is deleted.
MSHIP_KV_KEEP_MIN_TOKENS = env_int("MSHIP_KV_KEEP_MIN_TOKENS", 512)
MSHIP_KV_KEEP_RECENT_S = env_float("MSHIP_KV_KEEP_RECENT_S", 3600)
MSHIP_KV_KEEP_MAX_AGE_S = env_float("MSHIP_KV_KEEP_MAX_AGE_S", 86400)
# A llama.cpp request whose slot holds this many fewer blocks (512 characters) of its prompt
# than another free slot of its replica has that slot's cache copied into its own first
# (openai_api/routing/slot_copy.py): a shared system prompt computed once per replica, not
# once per slot. 0: never; with MSHIP_KV_KEEP_BYTES=0 neither (the copy goes through disk).
MSHIP_SLOT_COPY_MIN_BLOCKS = env_int("MSHIP_SLOT_COPY_MIN_BLOCKS", 4)
