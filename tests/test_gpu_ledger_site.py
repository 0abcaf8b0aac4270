"""GPU-seconds that add up on a real host's default: `serve --workers 4` and the simulated
engine. Two deployments share the site's memory (2 of its 17 GiB each, on a host without
GPUs: a share of the memory budget); bursts of streams from new connections spread over the workers
are divided by the scheduler's one meter; a slow reader pays for its work, not its reading;
and for each deployment what its requests were charged, its load and its idle time add up to
what it held."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
import pytest
from django.db.models import Sum
from django.utils import timezone

from openai_api.models import ApiKey
from openai_api.usage.held import held_gpu_seconds
from openai_api.usage.models import UsageMinute
from openai_api.usage.report import usage_rows
from tests.conftest import sim, wait_until
from tests.site_support import HI, Site, finished, known, shown, started, streams

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")
GIB = 2.0
SHARE = GIB / 17  # of the served site's 17 GiB budget


def charged(key: str, model: str) -> float:
    """The key's GPU-seconds on the model, as the usage table has them."""
    found = UsageMinute.objects.filter(key_id=ApiKey.objects.get(name=key).pk, deployment=model)
    return float(found.aggregate(s=Sum("gpu_seconds"))["s"] or 0.0)


def read_slowly(url: str, key: str, model: str, pause_s: float) -> float:
    """A stream whose client waits `pause_s` between reads: its seconds to the end."""
    began = time.monotonic()
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST",
            url + "/v1/chat/completions",
            json={"model": model, "messages": HI, "stream": True, "max_tokens": 20},
            headers={"authorization": f"Bearer {key}"},
        ) as answer,
    ):
        assert answer.status_code == 200
        for _ in answer.iter_raw(256):
            time.sleep(pause_s)
    return time.monotonic() - began


@pytest.mark.heavy
def test_it_adds_the_sites_gpu_time_up_over_four_workers(
    four_workers: Site, api_key: Callable[..., str], make_deployment: Callable[..., Deployment]
) -> None:
    url = four_workers.url
    since = timezone.now().replace(second=0, microsecond=0)  # usage is kept by the minute
    fast = sim(tokens_per_second=20)
    left = started(make_deployment, "left", memory_gib=GIB, config=fast)
    right = started(make_deployment, "right", memory_gib=GIB, config=fast)
    one, two, slow = (known(url, api_key(name)) for name in ("one", "two", "slow"))
    shown(url, one, "left", "ready")
    shown(url, one, "right", "ready")

    # Four streams of 40 tokens (2 s each) on each deployment, all at once.
    began = time.monotonic()
    bursts = [
        streams(url, one, "left", 4, max_tokens=40),
        streams(url, two, "right", 4, max_tokens=40),
    ]
    done = [finished(threads) for threads in bursts]
    window = time.monotonic() - began
    assert done == [[(200, True)] * 4] * 2
    # Its work is a second (20 tokens at 20 a second); its reading takes far longer.
    reading = read_slowly(url, slow, "left", pause_s=0.3)
    assert reading > 4

    wait_until(lambda: charged("slow", "left") > 0 and charged("two", "right") > 0, 15)
    # Each deployment holds its share: its four streams shared it for about 2 s (each worker
    # dividing among its own requests charged up to four times that; the whole budget,
    # 8.5 times more again).
    for key, model in (("one", "left"), ("two", "right")):
        assert SHARE * 1.5 < charged(key, model) <= SHARE * window, (key, charged(key, model))
    # The slow reader is charged its second of work, not its reading.
    assert charged("slow", "left") <= SHARE * 1.5, (charged("slow", "left"), reading)

    end = timezone.now() + timedelta(minutes=1)
    rows = {row["model"]: row for row in usage_rows(since, end, by=("model",))}
    for deployment in (left, right):
        held, load = held_gpu_seconds(deployment, since, timezone.now())[None]
        row = rows[deployment.name]
        assert load > 0 and row["idle_gpu_seconds"] > 0  # its start, and its quiet seconds
        total = row["gpu_seconds"] + row["load_gpu_seconds"] + row["idle_gpu_seconds"]
        assert total == pytest.approx(held, rel=0.01), (deployment.name, row, held)
