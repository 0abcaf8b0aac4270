"""GET /metrics: Modelship's own Prometheus metrics, summed over gateway processes, and the
access log's one JSON line per request."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx
import openai
import pytest
from django.contrib.auth.models import Permission, User
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from common import metrics
from deployments import deployer
from deployments.api.tokens import issue_token
from deployments.models import Deployment, State
from openai_api.models import ApiKey
from tests.conftest import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def test_it_counts_a_known_sequence_exactly_over_two_gateway_processes(
    two_gateways: list[str], make_deployment: Any, tmp_path: Path
) -> None:
    warm = make_deployment("warm", config={"reply": "hello there"})
    deployer.restart(warm.pk)
    make_deployment("lazy", mode="on_demand", config={"startup_delay_s": 0.3})
    key, secret = ApiKey.issue("metrics-app")
    a, b = (
        openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0, timeout=60)
        for url in two_gateways
    )
    hi: list[Any] = [{"role": "user", "content": "hi"}]
    assert a.chat.completions.create(model="warm", messages=hi).choices[0].message.content
    assert b.chat.completions.create(model="warm", messages=hi).usage is not None
    assert a.chat.completions.create(model="lazy", messages=hi).choices  # a cold start
    with pytest.raises(openai.NotFoundError):
        b.chat.completions.create(model="nope", messages=hi)

    scraped = httpx.get(two_gateways[1] + "/metrics")
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    samples = parse(scraped.text)
    by_key = f"msk-{key.prefix}"
    chat = "chat/completions"
    assert (
        value(
            samples,
            "modelship_requests_total",
            model="warm",
            endpoint=chat,
            status="200",
            key=by_key,
        )
        == 2
    )
    assert (
        value(
            samples,
            "modelship_requests_total",
            model="lazy",
            endpoint=chat,
            status="200",
            key=by_key,
        )
        == 1
    )
    assert (
        value(
            samples, "modelship_requests_total", model="", endpoint=chat, status="404", key=by_key
        )
        == 1
    )
    assert total(samples, "modelship_requests_total") == 4
    assert total(samples, "modelship_request_duration_seconds_count") == 4
    assert total(samples, "modelship_time_to_first_byte_seconds_count", model="warm") == 2
    assert value(samples, "modelship_cold_starts_total", deployment="lazy", outcome="ready") == 1
    assert total(samples, "modelship_cold_starts_total") == 1
    assert total(samples, "modelship_cold_start_duration_seconds_count", deployment="lazy") == 1
    assert total(samples, "modelship_tokens_total", model="warm", direction="out") > 0
    assert total(samples, "modelship_tokens_total", model="warm", direction="in") > 0
    # Nothing is in flight or queued once every answer is in.
    assert total(samples, "modelship_inflight_requests") == 0
    assert total(samples, "modelship_queued_requests") == 0
    assert value(samples, "modelship_deployment_state", deployment="lazy", state="ready") == 1
    assert value(samples, "modelship_deployment_state", deployment="warm", state="failed") == 0
    held = value(samples, "modelship_deployment_memory_held_bytes", deployment="warm")
    assert held == 1024**3
    assert value(samples, "modelship_route_table_loaded_timestamp_seconds") > 0

    # Each request's access line, from the process that served it.
    lines = [
        json.loads(line)
        for name in ("a", "b")
        for line in (tmp_path / f"{name}.out").read_text().splitlines()
        if line.startswith("{")
    ]
    assert sorted((line["model"], line["status"]) for line in lines) == [
        ("", 404),
        ("lazy", 200),
        ("warm", 200),
        ("warm", 200),
    ]
    cold = next(line for line in lines if line["model"] == "lazy")
    assert cold["waited"] == "start" and cold["endpoint"] == chat
    assert cold["key"] == by_key and cold["identity"] == f"key:{key.pk}"
    assert cold["ttfb_ms"] <= cold["duration_ms"] and cold["bytes"] > 0
    assert cold["request_id"] and cold["tokens_out"] > 0
    warm_line = next(line for line in lines if line["model"] == "warm")
    assert warm_line["waited"] is None


def test_it_logs_a_streamed_answer_with_its_bytes_and_nothing_when_off(
    gateway_url: str,
    api_key: Callable[..., str],
    serving: Callable[..., Deployment],
    access_lines: list[dict[str, Any]],
    site: Any,
) -> None:
    serving("talker", config={"reply": "one two three"})
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=api_key(), max_retries=0)
    stream = client.chat.completions.create(
        model="talker",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-request-id": "req-stream-1"},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "one two three"
    # Written by the access log's own thread, just after the answer's last byte.
    wait_until(lambda: any(line["request_id"] == "req-stream-1" for line in access_lines), 10)
    line = next(line for line in access_lines if line["request_id"] == "req-stream-1")
    assert line["status"] == 200 and line["model"] == "talker"
    assert line["path"] == "/v1/chat/completions" and line["method"] == "POST"
    assert line["bytes"] > len(text) and line["tokens_out"] == 3

    assert line["time"].endswith("+00:00") and line["waited"] is None

    def listed() -> float:
        scraped = parse(httpx.get(gateway_url + "/metrics").text)
        return total(scraped, "modelship_requests_total", endpoint="models")

    site.MSHIP_ACCESS_LOG = "off"
    before = listed()
    client.models.list(extra_headers={"x-request-id": "req-unlogged"})
    # A request's line is decided just after its last byte went out, where it is counted:
    # the setting goes back once the request has ended, not once its client has the answer.
    wait_until(lambda: listed() > before, 10)
    site.MSHIP_ACCESS_LOG = "json"
    client.models.list(extra_headers={"x-request-id": "req-logged"})
    wait_until(lambda: any(line["request_id"] == "req-logged" for line in access_lines), 10)
    assert not any(line["request_id"] == "req-unlogged" for line in access_lines)


def test_it_writes_a_path_that_needs_escaping_as_a_line_that_parses_back(
    gateway_url: str, access_lines: list[dict[str, Any]]
) -> None:
    """The access line is filled into a template: what a caller put in the path (quotes,
    backslashes, a tab, a character past ASCII) is escaped, not let out of its string."""
    path = '/v1/x", "status": 200, "evil": "\\\t\u00e9'
    answer = httpx.get(gateway_url + quote(path), headers={"x-request-id": "req-escaped"})
    assert answer.status_code in (401, 404)
    wait_until(lambda: any(line["request_id"] == "req-escaped" for line in access_lines), 10)
    line = next(line for line in access_lines if line["request_id"] == "req-escaped")
    assert line["path"] == path and line["status"] == answer.status_code and "evil" not in line


def test_it_refuses_metrics_outside_the_allow_list_without_a_token(
    client: Any, site: Any, db: None
) -> None:
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    site.MSHIP_METRICS_ALLOW = ["10.0.0.0/8"]
    refused = client.get("/metrics")
    assert refused.status_code == 401 and "MSHIP_METRICS_ALLOW" in refused.json()["detail"]
    viewer = User.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_deployment"))
    token = issue_token(viewer)
    allowed = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token}")
    assert allowed.status_code == 200 and "modelship_deployment_state" in allowed.text
    outsider = issue_token(User.objects.create_user("outsider", is_staff=True))
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {outsider}").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token wrong").status_code == 401
    assert client.post("/metrics").status_code == 405


FAILURES = "modelship_start_failures_total"


def test_it_records_start_failures_and_serves_engine_states(
    make_deployment: Any, client: Any
) -> None:
    broken = make_deployment("broken", config={"fail_at_start": True})
    counted = metrics.start_failures.labels("broken")
    before = counted._value.get()
    exposed = value(parse(client.get("/metrics").content.decode()), FAILURES, deployment="broken")
    deployer.restart(broken.pk)
    assert Deployment.objects.get(pk=broken.pk).state == State.FAILED
    assert counted._value.get() - before == 1
    after = parse(client.get("/metrics").content.decode())
    assert value(after, FAILURES, deployment="broken") - exposed == 1
    assert value(after, "modelship_deployment_state", deployment="broken", state="failed") == 1


def test_it_proxies_an_engines_own_metrics_and_lists_it_for_prometheus(
    make_deployment: Any,
) -> None:
    staff = APIClient()
    staff.force_authenticate(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    engine = make_deployment("gauged", num_replicas=2)
    stopped = make_deployment("resting")
    voice = make_deployment("voice", loader="tts", model="espeak", usecase="tts")
    deployer.restart(engine.pk)
    engine.refresh_from_db()

    answer = staff.get(f"/api/deployments/{engine.pk}/metrics/?replica=1")
    assert answer.status_code == 200
    assert "vllm:num_requests_running" in answer.content.decode()
    assert staff.get(f"/api/deployments/{engine.pk}/metrics/?replica=2").status_code == 404
    assert staff.get(f"/api/deployments/{engine.pk}/metrics/?replica=-1").status_code == 400
    refused = staff.get(f"/api/deployments/{stopped.pk}/metrics/")
    assert refused.status_code == 409 and refused.json()["code"] == "invalid_state"
    assert staff.get(f"/api/deployments/{voice.pk}/metrics/").json()["code"] == "not_served"

    targets = staff.get("/api/prometheus/targets").json()
    ports = [urlsplit(url).netloc for url in engine.engine_urls]
    assert targets == [
        {
            "targets": [ports[replica]],
            "labels": {
                "deployment": "gauged",
                "replica": str(replica),
                "loader": "simulated",
                "__meta_modelship_metrics_path": f"/api/deployments/{engine.pk}/metrics/",
            },
        }
        for replica in (0, 1)
    ]
    assert APIClient().get("/api/prometheus/targets").status_code in (401, 403)
