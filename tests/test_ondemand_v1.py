"""On-demand deployments called by name through /v1, with the official openai SDK: started
by the first request, once for a burst, refused with the seed's codes."""

from __future__ import annotations

import concurrent.futures
import json
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from deployments import deployer
from deployments.models import AuditEntry, Deployment, DeploymentEvent, State
from ondemand.registry import controllers
from tests.conftest import in_thread, wait_until
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")


def on_demand(make_deployment: Any, site: Any, name: str, **fields: Any) -> Deployment:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    deployment: Deployment = make_deployment(name, mode="on_demand", idle_timeout_s=60, **fields)
    seen_by_gateway(lambda s: name in s.routes)
    return deployment


def sdk(gateway_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=key, max_retries=0, timeout=60)


def ask(client: openai.OpenAI, model: str) -> str:
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return str(answer.choices[0].message.content)


@pytest.mark.sample("ondemand")
def test_it_starts_a_stopped_model_on_its_first_request(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    lazy = on_demand(
        make_deployment, site, "lazy", config={"reply": "woke up", "startup_delay_s": 0.5}
    )
    assert ask(sdk(gateway_url, api_key()), "lazy") == "woke up"
    lazy.refresh_from_db()
    assert lazy.state == State.READY
    assert lazy.lease_until is not None

    staff = APIClient()
    staff.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    shown = staff.get(f"/api/deployments/{lazy.pk}/").json()["ondemand"]
    assert shown["phase"] == "idle" and shown["inflight"] == 0 and shown["last_request_at"]
    start = AuditEntry.objects.get(action="ondemand_start")
    assert (start.actor, start.user) == ("ondemand", None)
    assert DeploymentEvent.objects.filter(
        deployment=lazy, kind="starting", actor="ondemand"
    ).exists()


@pytest.mark.postgres
def test_it_starts_once_for_fifty_concurrent_first_requests(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    burst = on_demand(make_deployment, site, "burst", config={"startup_delay_s": 1})
    client = sdk(gateway_url, api_key())
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        replies = list(pool.map(lambda _: ask(client, "burst"), range(50)))
    assert len(replies) == 50 and all(replies)
    assert DeploymentEvent.objects.filter(deployment=burst, kind="starting").count() == 1


def test_it_refuses_a_model_that_cannot_fit_at_all(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    on_demand(make_deployment, site, "huge", memory_gib=9)  # the site has 8 GiB
    with pytest.raises(openai.APIStatusError) as refused:
        ask(sdk(gateway_url, api_key()), "huge")
    assert (refused.value.status_code, refused.value.code) == (503, "does_not_fit")
    assert Deployment.objects.get(name="huge").state == State.PLANNED


def test_it_answers_503_with_the_cause_when_the_docker_engine_is_unreachable(
    gateway_url: str,
    api_key: Callable[..., str],
    make_deployment: Any,
    site: Any,
    tmp_path: Path,
) -> None:
    site.MSHIP_DOCKER_HOST = f"unix://{tmp_path}/no-docker.sock"  # nothing listens there
    on_demand(make_deployment, site, "boxed", runtime="docker", image="modelship:latest")
    client = sdk(gateway_url, api_key())
    for _ in range(2):  # no backoff: the next request tries again, and hears why again
        with pytest.raises(openai.APIStatusError) as refused:
            ask(client, "boxed")
        assert (refused.value.status_code, refused.value.code) == (503, "start_failed")
        assert "boxed failed to start: the Docker Engine is unreachable" in str(refused.value)
    assert Deployment.objects.get(name="boxed").state == State.PLANNED  # as it was


def test_it_backs_off_after_a_failed_start(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    broken = on_demand(make_deployment, site, "broken", config={"fail_at_start": True})
    client = sdk(gateway_url, api_key())
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as failed:
            ask(client, "broken")
        assert (failed.value.status_code, failed.value.code) == (503, "start_failed")
    # The second was refused by the backoff, without another start.
    assert DeploymentEvent.objects.filter(deployment=broken, kind="starting").count() == 1


def test_it_makes_room_by_putting_an_idle_model_to_sleep(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:

    first = on_demand(make_deployment, site, "first", memory_gib=5)
    on_demand(make_deployment, site, "second", memory_gib=5)
    client = sdk(gateway_url, api_key())
    assert ask(client, "first")
    # Long idle: in the controller's memory and on the row's lease.

    # The slot is released after the last byte, which the client may read first.
    wait_until(lambda: all(c.entry(first.pk).inflight == 0 for c in controllers()))
    for ctl in controllers():
        ctl.entry(first.pk).idle_since -= 3600
    Deployment.objects.filter(pk=first.pk).update(lease_until=timezone.now())
    assert ask(client, "second")
    first.refresh_from_db()
    assert first.state == State.STOPPED
    assert first.state_reason == "Put to sleep to make room for second"


def test_it_forgives_start_failures_after_a_mode_switch(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:

    broken = on_demand(make_deployment, site, "flaky", config={"fail_at_start": True})
    client = sdk(gateway_url, api_key())
    with pytest.raises(openai.APIStatusError):
        ask(client, "flaky")
    # Fixed, and switched back and forth: the backoff no longer holds the next start.
    Deployment.objects.filter(pk=broken.pk).update(config={"reply": "fixed"})
    staff = APIClient()
    staff.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    for mode in ("always_on", "on_demand"):
        assert (
            staff.patch(
                f"/api/deployments/{broken.pk}/mode/", {"mode": mode}, format="json"
            ).status_code
            == 200
        )
    Deployment.objects.filter(pk=broken.pk).update(state="stopped", pending_mode=None)
    seen_by_gateway(lambda s: s.routes["flaky"].state == "stopped")
    assert ask(client, "flaky") == "fixed"


def test_it_keeps_a_streaming_request_alive_while_its_model_starts(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    cold = on_demand(make_deployment, site, "cold", config={"startup_delay_s": 1.0})
    site.MSHIP_SSE_KEEPALIVE_S = 0.2
    headers = {"authorization": f"Bearer {api_key()}"}
    chat = {"model": "cold", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with httpx.stream(
        "POST", gateway_url + "/v1/chat/completions", json=chat, headers=headers
    ) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line]
    # While Modelship starts the model: comments, with what it waits for and an estimate (a
    # minute: no start of it was measured yet).
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert all(line.startswith(": ") for line in lines[:first_data])  # comments only
    # A plain keepalive may come first on a loaded host, before the controller has figures.
    wait = ": modelship-wait "
    said = [json.loads(line.removeprefix(wait)) for line in lines[:first_data] if wait in line]
    assert said[0] == {"waiting_for": "its start", "position": 0, "eta_s": 60}
    assert lines[-1] == "data: [DONE]"
    cold.refresh_from_db()
    assert cold.start_s is not None and cold.start_s < 10  # measured now: about a second

    deployer.stop(cold.pk)
    seen_by_gateway(lambda s: s.routes["cold"].state == "stopped")
    with httpx.stream(
        "POST",
        gateway_url + "/v1/responses",
        json={"model": "cold", "input": "x", "stream": True},
        headers=headers,
    ) as answer:
        lines = [line for line in answer.iter_lines() if line]
    again = json.loads(lines[0].removeprefix(": modelship-wait "))
    assert again["waiting_for"] == "its start" and again["eta_s"] <= 10  # from the measure
    first_event = next(i for i, line in enumerate(lines) if line.startswith("event: "))
    assert lines[first_event] == "event: response.created"
    assert all(line.startswith(": ") for line in lines[:first_event])  # comments only
    assert "event: response.completed" in lines


def test_it_says_the_wait_in_comments_the_official_sdks_read_past(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    site.MSHIP_SSE_KEEPALIVE_S = 0.2
    key = api_key()
    cold = on_demand(make_deployment, site, "cold", config={"startup_delay_s": 1.5})
    chunks = list(
        sdk(gateway_url, key).chat.completions.create(
            model="cold", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deployer.stop(cold.pk)
    seen_by_gateway(lambda s: s.routes["cold"].state == "stopped")
    claude = anthropic.Anthropic(base_url=gateway_url, api_key=key, max_retries=0, timeout=60)
    with claude.messages.stream(
        model="cold", max_tokens=16, messages=[{"role": "user", "content": "x"}]
    ) as stream:
        assert "".join(stream.text_stream)


def test_it_tells_where_a_model_stands_to_a_key_that_may_use_it(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    on_demand(make_deployment, site, "cold", config={"startup_delay_s": 2.0})
    key, other = api_key(), api_key("other", allowed_models=["nothing-here"])
    url = f"{gateway_url}/v1/models/cold/status"

    def status(secret: str = key) -> httpx.Response:
        return httpx.get(url, headers={"Authorization": f"Bearer {secret}"}, timeout=10)

    assert status(other).status_code == 404  # as for its card
    before = status().json()
    assert before["state"] == "planned · idle" and before["waiting"] is None
    waiting = in_thread(ask, sdk(gateway_url, key), "cold")  # a plain request: no stream
    wait_until(lambda: status().json()["waiting"] is not None, 10)
    during = status().json()
    assert during["state"].startswith("starting") and during["queued"] == 0
    figures = during["waiting"]
    assert (figures["waiting_for"], figures["position"]) == ("its start", 0)
    assert 55 <= figures["eta_s"] <= 60  # a minute (never measured), running down
    waiting.join(30)
    after = status().json()
    assert after["state"] == "ready" and after["waiting"] is None
    assert 1.5 < after["measured_start_s"] < 30


def test_it_ends_a_kept_alive_stream_with_the_refusal_as_an_event(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    on_demand(
        make_deployment, site, "doomed", config={"startup_delay_s": 1.0, "fail_at_start": True}
    )
    site.MSHIP_SSE_KEEPALIVE_S = 0.2
    headers = {"authorization": f"Bearer {api_key()}"}
    with httpx.stream(
        "POST",
        gateway_url + "/v1/responses",
        json={"model": "doomed", "input": "x", "stream": True},
        headers=headers,
    ) as answer:
        assert answer.status_code == 200  # committed by the keepalives
        lines = [line for line in answer.iter_lines() if line]
    assert lines[0].startswith(": modelship-wait ")
    events = [line for line in lines if line.startswith("event: ")]
    assert events[0] == "event: response.created" and events[-1] == "event: response.failed"
    assert any('"start_failed"' in line for line in lines)


def test_it_starts_a_small_model_while_a_big_one_waits_for_memory_nobody_freed(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    """Capacity 8: a busy 7 GiB model streams; a 6 GiB model queues behind it (nothing can
    be freed for it while it streams); a 1 GiB model fits in what is free and starts at
    once. The big one gives up at its queue timeout, having started nothing."""
    site.MSHIP_MEMORY_CAPACITY_GIB = 8
    site.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S = 6
    busy = on_demand(make_deployment, site, "busy", memory_gib=7, config={"tokens_per_second": 5})
    on_demand(make_deployment, site, "big", memory_gib=6)
    on_demand(make_deployment, site, "small", memory_gib=1, config={"reply": "small one"})
    deployer.restart(busy.pk)
    seen_by_gateway(lambda s: s.routes["busy"].state == "ready")
    client = sdk(gateway_url, api_key())
    streaming = client.chat.completions.create(
        model="busy", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=500
    )
    next(iter(streaming))  # its slot is held
    outcome: list[Any] = []

    def ask_big() -> None:
        try:
            outcome.append(ask(client, "big"))
        except openai.APIStatusError as exc:
            outcome.append(exc.status_code)

    waiting = in_thread(ask_big)
    big = Deployment.objects.get(name="big")
    wait_until(lambda: any(big.pk in c.queue for c in controllers()), 30)
    assert ask(client, "small") == "small one"  # behind the head, within what is free
    assert any(big.pk in c.queue for c in controllers())  # the head still waits
    waiting.join(30)
    assert outcome == [503]  # ondemand_queue_timeout: the busy one never became idle
    streaming.close()
    assert Deployment.objects.get(name="big").state == State.PLANNED


def test_it_warms_a_model_ahead_of_its_first_request_for_a_key_that_may_use_it(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    lazy = on_demand(make_deployment, site, "lazy", config={"startup_delay_s": 0.5})
    key, other = api_key(), api_key("other", allowed_models=["nothing-here"])
    warm = f"{gateway_url}/v1/models/lazy/warm"
    # A key that may not use it learns nothing of it, and nothing starts.
    hidden = httpx.post(warm, headers={"Authorization": f"Bearer {other}"}, timeout=60)
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"
    assert Deployment.objects.get(pk=lazy.pk).state == State.PLANNED
    warmed = httpx.post(warm, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert warmed.status_code == 200, warmed.text
    assert warmed.json() == {
        "id": "lazy",
        "object": "model",
        "owned_by": "modelship",
        "status": "ready",
    }
    assert Deployment.objects.get(pk=lazy.pk).state == State.READY
    # Ready already: at once; and the model's card is still read with GET.
    assert httpx.post(warm, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    card = httpx.get(f"{gateway_url}/v1/models/lazy", headers={"Authorization": f"Bearer {key}"})
    assert card.json()["id"] == "lazy"
    other_verb = httpx.put(warm, headers={"Authorization": f"Bearer {key}"})
    assert other_verb.status_code == 405
