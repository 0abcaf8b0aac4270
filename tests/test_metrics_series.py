"""The shipped Grafana dashboard against a freshly started site: every series it charts is in
/metrics from the start (at 0 until something happens, not absent), and the example
Prometheus set-up in examples/grafana reaches Modelship and its engines as written."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml
from django.contrib.auth.models import User
from prometheus_client.parser import text_string_to_metric_families

from deployments import deployer
from deployments.api.tokens import issue_token
from tests.conftest import REPO, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from deployments.models import Deployment

GRAFANA = REPO / "examples/grafana"
GIB = 1024**3

# PromQL's words that are not metric names.
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
PROMQL_WORDS |= {"group_left", "group_right", "inf", "nan"}


def dashboard_exprs() -> list[str]:
    def panels(within: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in within:
            yield panel
            yield from panels(panel.get("panels", []))  # a row's panels

    dashboard = json.loads((GRAFANA / "modelship.json").read_text())
    return [
        target["expr"]
        for panel in panels(dashboard["panels"])
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label
    matchers, ranges, groupings, functions, words and numbers are taken out."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"\$\w+|\b\d[\w.]*", "", bare)  # Grafana's variables, numbers, durations
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        following = bare[match.end() :].lstrip()
        if following.startswith("(") or match.group().lower() in PROMQL_WORDS:
            continue  # a function, an aggregation or a keyword
        names.add(match.group())
    return names


def charted() -> set[str]:
    return {name for expr in dashboard_exprs() for name in metric_names(expr)}


Series = dict[str, list[dict[str, str]]]


def series_of(text: str) -> Series:
    """Each sample name with the label sets it is exported with."""
    found: Series = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name].append(sample.labels)
    return found


def test_it_reads_every_metric_name_out_of_the_dashboards_queries() -> None:
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, model) (rate(x_bucket{status=~"4..|5.."}'
        "[$__rate_interval]))) or on (model) vector(0) + time() - y_seconds offset 5m"
    ) == {"x_bucket", "y_seconds"}
    assert len(charted()) >= 10 and all(name.startswith("modelship_") for name in charted())


def prometheus_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    return config


def scrape_job(name: str) -> dict[str, Any]:
    return next(job for job in prometheus_config()["scrape_configs"] if job["job_name"] == name)


def token_file() -> str:
    """Where the example's compose file mounts the token that README has one copy in."""
    compose = yaml.safe_load((GRAFANA / "compose.yaml").read_text())
    for volume in compose["services"]["prometheus"]["volumes"]:
        source, target, *_ = volume.split(":")
        if source == "./modelship_token":
            return str(target)
    raise AssertionError("compose.yaml mounts no ./modelship_token into Prometheus")


def headers_of(block: dict[str, Any], token: str) -> dict[str, str]:
    """The Authorization header Prometheus sends for a job's (or its SD's) `authorization`."""
    authorization = block.get("authorization")
    if authorization is None:
        return {}
    assert authorization["credentials_file"] == token_file()
    return {"Authorization": f"{authorization.get('type', 'Bearer')} {token}"}


class Scraper:
    """What Prometheus sends, as the example configures it, to the site at `base`: the
    config's own address goes in the Host header (the site checks it), the connection goes
    to the test's port."""

    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base, token

    def scrape_modelship(self) -> httpx.Response:
        job = scrape_job("modelship")
        [address] = job["static_configs"][0]["targets"]
        headers = {"Host": address, **headers_of(job, self.token)}
        path = job.get("metrics_path", "/metrics")
        return httpx.get(self.base + path, headers=headers, timeout=30)


@pytest.fixture
def live_env() -> dict[str, str]:
    """The served site (tests/live_support.py) on a GPU host of two declared GPUs, let in by
    the token only, not by loopback: compose.yaml's `web` sees the Docker bridge."""
    return {"MSHIP_GPU_INVENTORY": "8,8", "MSHIP_METRICS_ALLOW": ""}


@pytest.fixture
def deployed(make_deployment: Callable[..., Deployment]) -> None:
    """An always-on and an on-demand deployment, made before the site starts."""
    make_deployment("chat")
    make_deployment("lazy", mode="on_demand")


@pytest.fixture
def fresh_site(deployed: None, live: dict[str, str]) -> Scraper:
    """`manage.py serve` (server and cluster) with those deployments, which no request has
    reached; nothing runs yet."""
    token_path = Path(live["MSHIP_VAR_DIR"]) / "admin_token"
    # serve writes the admin's token once it has made the admin: after /health answers.
    wait_until(token_path.exists, 30)
    return Scraper(live["MSHIP_URL"], token_path.read_text().strip())  # README: cp it over


def test_it_exports_every_series_the_dashboard_charts_before_any_request(
    fresh_site: Scraper,
) -> None:
    scraped = fresh_site.scrape_modelship()
    assert scraped.status_code == 200, scraped.text
    exported = series_of(scraped.text)
    missing = sorted(name for name in charted() if not exported.get(name))
    assert not missing, f"the dashboard charts series /metrics lacks: {missing}"
    # Per deployment, each of them, at 0: a panel draws a line for every deployment.
    for name in charted():
        named = {labels.get("deployment") or labels.get("model") for labels in exported[name]}
        if named - {None}:
            assert {"chat", "lazy"} <= named, (name, named)
    for name in ("modelship_queued_requests", "modelship_queue_timeouts_total"):
        assert {s["deployment"] for s in exported[name]} == {"chat", "lazy"}
    counts = [
        sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
        if sample.name.endswith(("_total", "_count")) or family.type == "gauge"
        if family.name.startswith(("modelship_requests", "modelship_queue", "modelship_cold"))
    ]
    assert counts and not any(counts), "nothing has happened: every count is 0"
    # The host's memory budget, charted on every host: 16 GiB on two GPUs, nothing held.
    assert "modelship_host_memory_bytes" in charted()
    host = {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
        if sample.name == "modelship_host_memory_bytes"
    }
    assert host["capacity"] == host["free"] == 16 * GIB and host["held"] == 0


def test_it_shows_the_route_tables_age_from_the_start(fresh_site: Scraper) -> None:
    def loaded() -> float:
        text = fresh_site.scrape_modelship().text
        family = next(
            (
                f
                for f in text_string_to_metric_families(text)
                if f.name == "modelship_route_table_loaded_timestamp_seconds"
            ),
            None,
        )
        return float(family.samples[0].value) if family and family.samples else 0.0

    # The gateway loads its route table at start: its age is seconds, not since 1970.
    wait_until(lambda: time.time() - loaded() < 60, 30)


def relabelled(target: dict[str, Any], rules: list[dict[str, Any]]) -> dict[str, str]:
    """Prometheus's relabelling, as far as the example uses it (replace only)."""
    labels = {"__address__": target["targets"][0], **target["labels"]}
    for rule in rules:
        assert rule.get("action", "replace") == "replace", rule
        joined = rule.get("separator", ";").join(
            labels.get(name, "") for name in rule.get("source_labels", [])
        )
        match = re.fullmatch(rule.get("regex", "(.*)"), joined)
        if match:
            replacement = re.sub(r"\$\{?(\d+)\}?", r"\\\1", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
    return labels


@pytest.mark.usefixtures("engines")
def test_it_scrapes_engines_through_modelship_as_the_example_configures(
    make_deployment: Callable[..., Deployment], site: Any, client: Any
) -> None:
    engine = make_deployment("gauged", num_replicas=2)
    deployer.restart(engine.pk)
    viewer = User.objects.create_superuser("prometheus", "p@example.com", "pw-123456")
    token = issue_token(viewer)
    job = scrape_job("engines")
    [sd] = job["http_sd_configs"]
    sd_url = httpx.URL(sd["url"])
    discovered = client.get(
        sd_url.path,
        HTTP_HOST=sd_url.netloc.decode(),
        REMOTE_ADDR="172.17.0.2",
        HTTP_AUTHORIZATION=headers_of(sd, token)["Authorization"],
    )
    assert discovered.status_code == 200, discovered.content
    scraped = []
    for target in discovered.json():
        labels = relabelled(target, job.get("relabel_configs", []))
        params = {k.removeprefix("__param_"): v for k, v in labels.items() if "__param_" in k}
        answer = client.get(
            labels.get("__metrics_path__", job.get("metrics_path", "/metrics")),
            params,
            HTTP_HOST=labels["__address__"],
            REMOTE_ADDR="172.17.0.2",
            HTTP_AUTHORIZATION=headers_of(job, token)["Authorization"],
        )
        assert answer.status_code == 200, answer.content
        assert "vllm:num_requests_running" in answer.content.decode()
        scraped.append((labels["deployment"], labels["replica"], labels.get("instance")))
    assert [s[:2] for s in scraped] == [("gauged", "0"), ("gauged", "1")]
    # Each engine keeps its own address as its instance.
    assert len({s[2] for s in scraped}) == 2
