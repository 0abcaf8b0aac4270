"""The tiers an idle engine that sleeps rests in (vLLM sleep mode): level 1 keeps its weights
in host memory (a wake takes a fraction of a second to a few), level 2 discards them (a wake
reloads them from disk: slower, but no process start, no CUDA graph capture), and after
MSHIP_SLEEP_MAX_S asleep it is stopped (ondemand/reaper.py).

Level 1 while the engines asleep at level 1 and this one fit in MSHIP_SLEEP_HOST_GIB of host
memory (its weights are taken as its memory claim, which holds them and its KV cache: an
upper bound), else level 2. An engine that cannot sleep has two tiers, loaded and stopped.
"""

from __future__ import annotations

import functools

import httpx
from django.conf import settings

from deployments.gate import sleep_gate
from deployments.memory import need_gib
from deployments.models import Deployment, State

KEEPS_WEIGHTS, DROPS_WEIGHTS = 1, 2


@functools.cache
def host_memory_gib() -> float:
    """MemTotal of /proc/meminfo (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def host_budget_gib() -> float:
    """What level-1 sleepers may keep in host memory: MSHIP_SLEEP_HOST_GIB, or half the
    host's memory when it is not set (negative)."""
    configured = float(settings.MSHIP_SLEEP_HOST_GIB)
    return configured if configured >= 0 else host_memory_gib() / 2


def level_for(deployment: Deployment) -> int:
    """The level it sleeps at now, claimed: 1 while the host budget holds it beside the
    others at level 1 (asleep, or going to sleep or stopping with that level claimed), else
    2. Chosen and written on its row (marked stopping) under the sleep gate, so that two
    sleeps at once never both take the last of the budget."""
    with sleep_gate():
        kept = sum(
            need_gib(row)
            for row in Deployment.objects.filter(
                state__in=(State.ASLEEP, State.STOPPING), sleep_level=KEEPS_WEIGHTS
            ).exclude(pk=deployment.pk)
        )
        fits = kept + need_gib(deployment) <= host_budget_gib()
        level = KEEPS_WEIGHTS if fits else DROPS_WEIGHTS
        Deployment.objects.filter(pk=deployment.pk, state=State.STOPPING).update(sleep_level=level)
    return level


def wake_steps(level: int | None) -> list[tuple[str, dict[str, str] | None]]:
    """The calls that wake each engine (path, JSON body): after a level-2 sleep its weights are
    reloaded and its prefix cache, which held the old ones' keys, is reset."""
    steps: list[tuple[str, dict[str, str] | None]] = [("/wake_up", None)]
    if level == DROPS_WEIGHTS:
        steps += [("/collective_rpc", {"method": "reload_weights"}), ("/reset_prefix_cache", None)]
    return steps


def call_each(
    urls: list[str],
    steps: list[tuple[str, dict[str, str] | None]],
    auth: httpx.Auth | None = None,
) -> None:
    """Each step on every engine, in order; raises httpx.HTTPError on the first refusal.
    `auth`: the engines' secrets (engine_secrets.auth)."""
    with httpx.Client(timeout=settings.MSHIP_START_TIMEOUT_S, auth=auth) as client:
        for url in urls:
            for path, body in steps:
                client.post(url + path, json=body).raise_for_status()


def label(level: int | None) -> str:
    """The tier in words, for its page and `modelship ps`."""
    return {
        KEEPS_WEIGHTS: "weights in host memory",
        DROPS_WEIGHTS: "weights dropped",
    }.get(level or 0, "")
