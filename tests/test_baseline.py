"""The baseline (ondemand/baseline.py): once the host has been idle a while, the on-demand
deployments marked preload that run nothing are started again where they fit; never while
anything is in use or changing, never by stopping another, never a failed one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from deployments import deployer
from deployments.models import Deployment, State
from ondemand import baseline

pytestmark = pytest.mark.usefixtures("engines")


def quiet_for(seconds: float) -> None:
    """Every row's last change and lease that long ago."""
    then = timezone.now() - timedelta(seconds=seconds)
    Deployment.objects.update(state_changed_at=then, lease_until=then)


def test_it_restores_the_baseline_once_the_host_has_been_idle(
    make_deployment: Any, settings: Any
) -> None:
    settings.MSHIP_BASELINE_AFTER_S = 600
    settings.MSHIP_MEMORY_CAPACITY_GIB = 3
    chat = make_deployment("chat", mode="on_demand", preload=True, memory_gib=1)
    big = make_deployment("big", mode="on_demand", preload=True, memory_gib=5)  # never fits
    broken = make_deployment("broken", mode="on_demand", preload=True, memory_gib=1)
    Deployment.objects.filter(pk=broken.pk).update(state=State.FAILED)
    make_deployment("other", mode="on_demand", memory_gib=1)  # not in the baseline
    quiet_for(300)
    assert baseline.restore() == []  # idle, but not for long enough
    quiet_for(601)
    busy = make_deployment("busy", memory_gib=1)
    deployer.restart(busy.pk)  # something just changed
    assert baseline.restore() == []
    quiet_for(601)
    assert baseline.restore() == ["chat"]
    assert Deployment.objects.get(pk=chat.pk).state == State.READY
    assert Deployment.objects.get(pk=big.pk).state == State.PLANNED  # no room: left alone
    assert Deployment.objects.get(pk=broken.pk).state == State.FAILED
    assert Deployment.objects.get(name="other").state == State.PLANNED


def test_it_restores_nothing_with_the_baseline_off(make_deployment: Any, settings: Any) -> None:
    settings.MSHIP_BASELINE_AFTER_S = 0
    make_deployment("chat", mode="on_demand", preload=True, memory_gib=1)
    quiet_for(86400)
    assert baseline.restore() == []
