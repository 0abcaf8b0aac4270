"""The route table is read again when a write moved a table's stamp, and only then: every
kind of write moves it (save, a queryset's update, delete, create, bulk update), a write no
route reads (a lease, a key's last use) does not, and the gateway sees a change made
behind its back by a queryset update, with no nudge."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.utils import timezone

from common.versioned import stamp
from deployments.models import Deployment, State
from openai_api.catalog import catalog
from openai_api.models import ApiKey
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable


def test_it_moves_the_stamp_on_every_kind_of_write_but_the_unread_fields(
    make_deployment: Callable[..., Deployment],
) -> None:
    first = make_deployment("one")
    second = make_deployment("two")
    seen = [stamp(Deployment)]

    def moved() -> bool:
        now = stamp(Deployment)
        changed = now != seen[-1]
        seen.append(now)
        return changed

    first.aliases = ["uno"]
    first.save()
    assert moved()
    Deployment.objects.filter(pk=second.pk).update(state=State.READY)
    assert moved()
    Deployment.objects.bulk_update([first], ["model"])
    assert moved()
    first.save(update_fields=["model"])
    assert moved()
    Deployment.objects.filter(pk=first.pk).update(lease_until=timezone.now())
    Deployment.objects.filter(pk=first.pk).update(state_reason="loading 40%")
    first.lease_until = timezone.now() + timedelta(minutes=1)
    first.save(update_fields=["lease_until"])
    assert not moved()
    second.delete()
    assert moved()
    make_deployment("three")
    assert moved()
    key, _ = ApiKey.issue("app")
    keys = stamp(ApiKey)
    key.last_used = timezone.now()
    key.save(update_fields=["last_used"])
    assert stamp(ApiKey) == keys
    ApiKey.objects.filter(pk=key.pk).update(revoked=True)
    assert stamp(ApiKey) != keys


@pytest.mark.usefixtures("engines")
def test_it_reads_the_rows_again_only_when_the_stamp_moved(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment], site: Any
) -> None:
    deployment = serving("sim")
    secret = api_key()
    headers = {"authorization": f"Bearer {secret}"}
    assert httpx.get(gateway_url + "/v1/models", headers=headers).status_code == 200
    read = catalog.snapshot.read_at if catalog.snapshot else 0.0
    # Unchanged tables: the table is confirmed current (its age stays small) without a read.
    confirmed = time.monotonic()
    wait_until(lambda: catalog.snapshot is not None and catalog.snapshot.loaded_at > confirmed)
    Deployment.objects.filter(pk=deployment.pk).update(lease_until=timezone.now())
    later = time.monotonic()
    wait_until(lambda: catalog.snapshot is not None and catalog.snapshot.loaded_at > later)
    assert catalog.snapshot is not None and catalog.snapshot.read_at == read
    # A queryset update (no save, no signal) is seen at the next check, with no nudge.
    Deployment.objects.filter(pk=deployment.pk).update(state=State.STOPPED)
    wait_until(
        lambda: (
            catalog.snapshot is not None and catalog.snapshot.routes["sim"].state == State.STOPPED
        )
    )
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={"model": "sim", "messages": [{"role": "user", "content": "hi"}]},
        headers=headers,
    )
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "model_not_ready"
    # And so is a key revoked the same way: refused within a check.
    ApiKey.objects.filter(prefix=secret.split("-")[1]).update(revoked=True)
    wait_until(lambda: httpx.get(gateway_url + "/v1/models", headers=headers).status_code == 401)
    seen_by_gateway(lambda s: all(k.revoked for k in s.keys.values()))
    Deployment.objects.filter(pk=deployment.pk).update(state=State.READY)  # its engine runs
