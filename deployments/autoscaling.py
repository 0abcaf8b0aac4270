"""Replicas that follow load: the seed's Ray Serve `autoscaling_config`, and the decision
made from it. Pure: no database, no engines (autoscaler.py reads the load and acts).

A deployment asks for `ceil(ongoing / target_ongoing_requests)` replicas, within
`min_replicas` and `max_replicas`, where `ongoing` is what its replicas run and queue
together. A change is made only once the wish has held for the upscale (or downscale)
delay, so a short burst or lull changes nothing. `min_replicas: 0` lets the deployment go
to zero: it is on demand, stopped by the reaper when idle and started by the controller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from common.spelling import unknown

KEYS = {
    "min_replicas",
    "max_replicas",
    "initial_replicas",
    "target_ongoing_requests",
    "upscale_delay_s",
    "downscale_delay_s",
}
MAX_REPLICAS = 64  # num_replicas's own bound


@dataclass(frozen=True)
class AutoscalingConfig:
    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    # Ray Serve's defaults.
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0

    @classmethod
    def of(cls, values: dict[str, Any] | None) -> AutoscalingConfig | None:
        """The config of a deployment's `autoscaling_config` (checked first), or None."""
        if not values:
            return None
        return cls(**{key: values[key] for key in KEYS if values.get(key) is not None})

    @property
    def initial(self) -> int:
        """Replicas a start brings up: initial_replicas, else min_replicas (at least one)."""
        wanted = self.initial_replicas if self.initial_replicas is not None else self.min_replicas
        return max(1, min(wanted, self.max_replicas))

    def desired(self, ongoing: float) -> int:
        """Replicas for this much load, within the bounds (at least one while it runs)."""
        wanted = math.ceil(ongoing / self.target_ongoing_requests - 1e-9)
        return max(1, self.min_replicas, min(self.max_replicas, wanted))


def problems(values: Any) -> list[str]:
    if values is None:
        return []
    if not isinstance(values, dict):
        return ["must be a mapping"]
    found = [unknown(key, KEYS, "key") for key in sorted(set(values) - KEYS)]

    def number(key: str, lowest: float, integer: bool) -> float | None:
        value = values.get(key)
        if value is None:
            return None
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not lowest <= value < 2**31:
            what = "a whole number" if integer else "a number"
            found.append(f"{key}: must be {what} from {lowest:g}, not {value!r}")
            return None
        return float(value)

    least = number("min_replicas", 0, True)
    most = number("max_replicas", 1, True)
    initial = number("initial_replicas", 0, True)
    target = number("target_ongoing_requests", 0, False)
    number("upscale_delay_s", 0, False)
    number("downscale_delay_s", 0, False)
    if most is None and "max_replicas" not in values:
        found.append("max_replicas: required")
    if most is not None and most > MAX_REPLICAS:
        found.append(f"max_replicas: at most {MAX_REPLICAS}")
    if least is not None and most is not None and least > most:
        found.append("min_replicas: more than max_replicas")
    if initial is not None and most is not None and initial > most:
        found.append("initial_replicas: more than max_replicas")
    if target is not None and target <= 0:
        found.append("target_ongoing_requests: must be above 0")
    return found


@dataclass
class Wish:
    """Since when a deployment has wanted more (or fewer) replicas than it runs."""

    direction: int = 0  # +1 more, -1 fewer, 0 as it is
    since: float = 0.0


@dataclass
class Decider:
    """Applies the delays: a new replica count once the wish has held long enough."""

    wishes: dict[int, Wish] = field(default_factory=dict)

    def decide(
        self,
        deployment_id: int,
        config: AutoscalingConfig,
        running: int,
        ongoing: float,
        now: float,
    ) -> int | None:
        """The replica count to go to now, or None to leave it as it is."""
        target = config.desired(ongoing)
        direction = (target > running) - (target < running)
        wish = self.wishes.setdefault(deployment_id, Wish())
        if direction != wish.direction:
            wish.direction, wish.since = direction, now
        if direction == 0:
            return None
        delay = config.upscale_delay_s if direction > 0 else config.downscale_delay_s
        if now - wish.since < delay:
            return None
        wish.since = now  # the next step waits its delay again
        return target

    def forget(self, deployment_id: int) -> None:
        self.wishes.pop(deployment_id, None)
