"""The replica choice with its state: the loads it weighs (this process's outstanding
requests, plus the other processes' where Redis shares them), the conversations' table and
the round-robin turn. The choice itself is choice.choose, pure."""

from __future__ import annotations

import itertools

from django.conf import settings

from common import metrics
from openai_api import access
from openai_api.routing.affinity import Affinity
from openai_api.routing.choice import Reason, choose, home
from openai_api.routing.hints import current
from openai_api.routing.shared import Shared


class Router:
    def __init__(self, outstanding: dict[str, int]) -> None:
        self.outstanding = outstanding
        self.affinity = Affinity()
        self.shared = Shared(outstanding, self.affinity)
        self.turns = itertools.count()

    def loads(self, urls: tuple[str, ...]) -> dict[str, int]:
        local, remote = self.outstanding, self.shared.remote
        return {url: local.get(url, 0) + remote.get(url, 0) for url in urls}

    async def pick(self, urls: tuple[str, ...], deployment: str) -> tuple[str, Reason]:
        """One of several replicas for the running request (its hint in hints.current); the
        choice is remembered for the conversation's next turn and told to the access record."""
        policy = settings.MSHIP_ROUTING_POLICY
        hint = current.get() if policy == "cache-aware" else None
        shared = self.shared.configured()
        if shared:
            self.shared.start()
        affine = None
        if hint is not None and hint.conversation is not None:
            affine = self.affinity.get(hint.conversation)
            if affine is None and shared and self.shared.healthy:
                affine = await self.shared.lookup(hint.conversation)
        url, reason = choose(
            urls,
            self.loads(urls),
            policy=policy,
            affine=affine,
            prefix=hint.prefix if hint is not None else None,
            epsilon=min(max(settings.MSHIP_ROUTING_LOAD_BOUND, 0.0), 100.0),
            turn=next(self.turns),
        )
        if hint is not None:
            # Another process finds a conversation at its prefix's own replica by itself:
            # one placed elsewhere (a spill, the least loaded) is shared, and one moved.
            moved = affine is not None and affine != url
            natural = hint.prefix is not None and url == home(hint.prefix, urls)
            share = shared and (moved or (hint.prefix is not None and not natural))
            ttl = settings.MSHIP_ROUTING_AFFINITY_S
            for key in (hint.conversation, hint.also):
                if key is not None:
                    self.affinity.put(key, url, ttl, share=share)
        metrics.routing_choices.labels(deployment, reason).inc()
        record = access.current.get()
        if record is not None:
            record.replica, record.routed_by = urls.index(url), reason
        return url, reason
