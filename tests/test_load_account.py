"""A start is cost too (README, "Usage and budgets"): an on-demand start's GPU-seconds, launch
to ready, are the deployment's load account, shown beside its requests' use and attributed to
the keys whose requests waited for it; with MSHIP_USAGE_BUDGET_LOADS they count against those
keys' GPU-second budgets."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import openai
import pytest
from django.db.models import Sum
from django.utils import timezone

from openai_api.models import ApiKey
from openai_api.usage.ledger import ledger
from openai_api.usage.models import UsageMinute
from openai_api.usage.report import usage_rows, used_so_far
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")
HI: Any = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("counted", [False, True], ids=["load-apart", "load-in-budgets"])
def test_it_charges_a_start_to_its_load_account_and_the_keys_that_waited(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any, counted: bool
) -> None:
    site.MSHIP_USAGE_BUDGET_LOADS = counted
    since = timezone.now().replace(second=0, microsecond=0)
    make_deployment(
        "lazy", mode="on_demand", idle_timeout_s=60, num_gpus=1, config={"startup_delay_s": 1}
    )
    seen_by_gateway(lambda s: "lazy" in s.routes)
    secret = api_key("waiter", gpu_seconds_per_day=1)
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=secret, max_retries=0)
    client.chat.completions.create(model="lazy", messages=HI)  # starts it: a second or more

    ledger.flush()
    key = ApiKey.objects.get(name="waiter")
    mine = UsageMinute.objects.filter(key_id=key.pk, deployment="lazy").aggregate(
        load=Sum("load_gpu_seconds"), used=Sum("gpu_seconds")
    )
    assert mine["load"] >= 1.0  # a whole GPU for its start, which it waited for
    assert mine["used"] < 1.0  # its own answer took a moment
    until = timezone.now() + timedelta(minutes=1)
    (row,) = usage_rows(since, until, by=("model",))
    # The deployment's load account, from its state events: what the key was attributed.
    assert row["load_gpu_seconds"] == pytest.approx(mine["load"], rel=0.25)
    (by_key,) = usage_rows(since, until, by=("key",), key_id=key.pk)
    assert by_key["load_gpu_seconds"] == pytest.approx(mine["load"], abs=0.001)

    spent = used_so_far(key, timezone.now())["gpu_seconds_per_day"]
    if counted:
        assert spent >= 1.0
        with pytest.raises(openai.RateLimitError, match="gpu_seconds_per_day"):
            client.chat.completions.create(model="lazy", messages=HI)
    else:
        assert spent < 1.0
        client.chat.completions.create(model="lazy", messages=HI)
